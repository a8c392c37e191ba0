"""The manifest: the store's one mutable object, a JSON log of immutable packs.

Every published version has an entry per object: a "delta" from its base version, and
at anchors a "snapshot" too (the first version has only the snapshot). A version may also
have a catch-up delta from the boot version (the checkpoint the run began from), so that a
sampler that booted from it reaches the version in one delta. Entries are ordered by
version, then kind (deltas before the snapshot), then base; keys are unique and
content-addressed, so a key is never reused for other bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable

from weight_teleport.errors import ManifestError
from weight_teleport.format.parts import Part, check_covers, parse_part
from weight_teleport.store.errors import InvalidKey
from weight_teleport.store.hashing import PIECE_BYTES, tree_sha256
from weight_teleport.store.keys import validate_key

FORMAT = "weight-teleport-manifest/1"
FORMAT_PARTS = "weight-teleport-manifest/2"
"""The format of a manifest with an entry made of parts (a version of several writers)."""
FORMAT_BOOT = "weight-teleport-manifest/3"
"""The format of a manifest with a boot version, whose versions may have a second delta:
a catch-up delta from the boot version (entries may also be made of parts)."""
FORMATS = (FORMAT, FORMAT_PARTS, FORMAT_BOOT)
KINDS = ("delta", "snapshot")
MAX_MANIFEST_BYTES = 16 << 20
"""Largest manifest parsed (the origin's default `max_manifest_bytes`): about 60 k entries."""
MAX_INT = (1 << 63) - 1
MAX_SIDE_FILES = 64
"""Side files an entry may list."""
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,254}\Z")
_TOP_REQUIRED = {"format", "latest", "model", "entries"}
_TOP_OPTIONAL = {"signature", "retention", "boot"}

Signer = Callable[[bytes], dict]
"""Canonical bytes -> the manifest's "signature" member."""
Verifier = Callable[[bytes, object], None]
"""(canonical bytes, the "signature" member or None) -> None, or ManifestSignatureError."""


@dataclass(frozen=True)
class SideFile:
    """A small file of the checkpoint (config.json, tokenizer files) stored beside an
    anchor, so that a checkpoint pulled from the store is one an engine starts from."""

    name: str
    """A plain file name (no directory), never a `.safetensors` file."""
    key: str
    """The file's key in the store."""
    size: int
    sha256: str
    """Hex SHA-256 of the file's bytes."""


@dataclass(frozen=True)
class Retention:
    """What the publisher's retention keeps, and what it removed already."""

    keep_anchors: int
    """Anchors kept (0: everything); older objects are removed (`RetentionConfig`)."""
    removed_through: int | None = None
    """The newest version whose objects retention removed (None: nothing removed)."""


@dataclass(frozen=True)
class Entry:
    """One immutable object of the store."""

    version: int
    """The version the object produces."""
    kind: str
    """"delta" (needs `base`) or "snapshot" (an anchor: needs nothing)."""
    base: int | None
    """The version a delta applies to; None for a snapshot."""
    key: str
    """The object's key in the store."""
    size: int
    """The object's length in bytes."""
    sha256: str
    """Hex content hash of the object's bytes (`store.hashing.object_hash`)."""
    raw_bytes: int = 0
    """Bytes of the weights the object describes (for ratios)."""
    piece_bytes: int = 0
    """How `sha256` was taken: 0, the SHA-256 of the bytes; else the SHA-256 tree over
    pieces of this many bytes (`store.hashing`), which readers check in parallel."""
    published_at_ms: int = 0
    """When the publisher announced the object: Unix time in milliseconds (0: unknown)."""
    files: tuple[SideFile, ...] = ()
    """Snapshots: the checkpoint's side files published with it (`pull` writes them)."""
    catchup: bool = False
    """A catch-up delta: from the manifest's boot version, published beside the version's
    own delta (format 3). It applies as any delta; retention keeps the newest one only."""
    parts: tuple[Part, ...] = ()
    """The packs of a version made of parts (several writers); then `key`, `size` and
    `sha256` are those of the first part and of all of them together (`parts_entry`),
    in memory only: the stored entry lists its parts alone."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The store keys of the entry's objects."""
        return tuple(p.key for p in self.parts) if self.parts else (self.key,)

    def to_dict(self) -> dict:
        """The entry as stored (the optional members only where they say something)."""
        if self.parts:
            d = {
                "version": self.version,
                "kind": self.kind,
                "base": self.base,
                "raw_bytes": self.raw_bytes,
                "parts": [p.to_doc() for p in self.parts],
            }
        else:
            d = asdict(self)
            del d["parts"]
            if not self.catchup:
                del d["catchup"]
            if not self.files:
                del d["files"]
            else:
                d["files"] = [asdict(f) for f in self.files]
        if self.published_at_ms:
            d["published_at_ms"] = self.published_at_ms
        else:
            d.pop("published_at_ms", None)
        return d


def parts_entry(
    version: int, kind: str, base: int | None, parts: tuple[Part, ...], raw_bytes: int, published_at_ms: int = 0
) -> Entry:
    """The entry of a version made of `parts` (at least one)."""
    return Entry(
        version,
        kind,
        base,
        parts[0].key,
        sum(p.size for p in parts),
        parts[0].sha256,
        raw_bytes,
        0,
        published_at_ms,
        parts=tuple(parts),
    )


_FIELDS = {f.name for f in fields(Entry)} - {"parts"}
_REQUIRED = _FIELDS - {"raw_bytes", "piece_bytes", "published_at_ms", "files", "catchup"}
_FILE_FIELDS = {f.name for f in fields(SideFile)}
_PARTS_FIELDS = {"version", "kind", "base", "raw_bytes", "parts", "published_at_ms"}
MIN_PIECE, MAX_PIECE = 1 << 16, 1 << 30
"""The piece sizes a reader accepts (powers of two)."""


@dataclass(frozen=True)
class Manifest:
    """The versions a store holds, in order."""

    entries: tuple[Entry, ...] = ()
    model: dict = field(default_factory=dict)
    """Free-form description of the weights (names, dtypes), for people and `status`."""
    retention: Retention | None = None
    """What retention keeps and removed (None: the publisher did not say)."""
    boot: int | None = None
    """The boot version: the checkpoint the run began from, which samplers may hold from
    their start. Its anchor is kept by retention, and the publisher adds a catch-up delta
    from it to some versions (`PublisherConfig.catchup_every`). None: no boot version."""

    @property
    def latest(self) -> int | None:
        """The newest published version, or None when the store is empty."""
        return self.entries[-1].version if self.entries else None

    @property
    def anchors(self) -> list[Entry]:
        return [e for e in self.entries if e.kind == "snapshot"]

    @property
    def versions(self) -> list[int]:
        return sorted({e.version for e in self.entries})

    @property
    def format(self) -> str:
        """The oldest format that describes this manifest (what `to_json` writes)."""
        if self.boot is not None or _several_deltas(self.entries) or any(e.catchup for e in self.entries):
            return FORMAT_BOOT
        return FORMAT_PARTS if any(e.parts for e in self.entries) else FORMAT

    def catchup_deltas(self) -> list[Entry]:
        """The catch-up deltas, oldest first."""
        return [e for e in self.entries if e.catchup]

    def with_entries(self, *entries: Entry) -> "Manifest":
        """A new manifest with `entries` appended (checked)."""
        return checked(replace(self, entries=self.entries + tuple(entries)))

    def to_json(self, sign: Signer | None = None) -> bytes:
        """The manifest as the bytes stored in the store; `sign` (signing.ManifestSigner)
        adds a "signature" member over its canonical bytes (docs/FORMAT.md, Manifest)."""
        fmt = self.format
        doc = {
            "format": fmt,
            "latest": self.latest,
            "model": self.model,
            "entries": [e.to_dict() for e in self.entries],
        }
        if self.retention is not None:
            doc["retention"] = asdict(self.retention)
        if self.boot is not None:
            doc["boot"] = self.boot
        if sign is not None:
            doc["signature"] = sign(canonical_bytes(doc))
        return json.dumps(doc, indent=1, sort_keys=True).encode()


def canonical_bytes(doc: dict) -> bytes:
    """The bytes a manifest's signature covers: the document without its "signature"
    member, as compact JSON with sorted keys, in ASCII (non-ASCII characters escaped).
    Manifests hold no floats (the parser refuses them), so these bytes are one function
    of the parsed document."""
    unsigned = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def from_json(data: bytes, *, verify: Verifier | None = None, max_bytes: int = MAX_MANIFEST_BYTES) -> Manifest:
    """Parse and check a stored manifest; raise ManifestError if it is not a valid one.

    Untrusted input: the size is checked before parsing, every field's type and range
    after, and nothing but ManifestError escapes. `verify` (signing.ManifestVerifier)
    checks the signature before the entries are read; it raises ManifestSignatureError."""
    if len(data) > max_bytes:
        raise ManifestError(
            f"the manifest is {len(data)} bytes, over the {max_bytes}-byte limit: not a manifest this library wrote"
        )
    doc = _parse(data)
    if verify is not None:
        verify(canonical_bytes(doc), doc.get("signature"))
    entries = doc["entries"]
    if not isinstance(entries, list):
        raise ManifestError(f"malformed manifest: entries is a {type(entries).__name__}, not a list")
    manifest = checked(
        Manifest(
            tuple(_entry(i, e) for i, e in enumerate(entries)),
            _model(doc["model"]),
            _retention(doc.get("retention")),
            _boot(doc),
        )
    )
    if FORMATS.index(doc["format"]) < FORMATS.index(manifest.format):
        raise ManifestError(
            f"malformed manifest: a {doc['format']} manifest with what only {manifest.format} describes "
            "(entries made of parts, a boot version, catch-up deltas, a version with two deltas)"
        )
    if doc["latest"] != manifest.latest or isinstance(doc["latest"], bool):
        raise ManifestError(
            f"malformed manifest: latest is {str(doc['latest'])[:40]!r}, its last entry is version {manifest.latest}"
        )
    return manifest


def _parse(data: bytes) -> dict:
    """The manifest's top-level object: JSON without floats, NaNs or repeated keys."""
    try:
        doc = json.loads(data, parse_float=_no_float, parse_constant=_no_float, object_pairs_hook=_unique)
    except ManifestError:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ManifestError(f"malformed manifest: not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"malformed manifest: a JSON {type(doc).__name__}, not an object")
    if doc.get("format") not in FORMATS:
        raise ManifestError(
            f"not a {', '.join(FORMATS)} manifest (format "
            f"{str(doc.get('format'))[:100]!r}): a newer writer's? upgrade weight-teleport"
        )
    missing, unknown = _TOP_REQUIRED - doc.keys(), doc.keys() - _TOP_REQUIRED - _TOP_OPTIONAL
    if missing or unknown:
        raise ManifestError(f"malformed manifest: missing {sorted(missing)}, unknown {sorted(unknown)[:5]}")
    return doc


def _no_float(text: str):
    raise ManifestError(f"malformed manifest: number {text[:40]!r} is not an integer")


def _unique(pairs: list[tuple[str, object]]) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ManifestError("malformed manifest: an object repeats a key")
    return doc


def _int(entry: dict, name: str, low: int) -> int:
    value = entry[name]
    if type(value) is not int or not low <= value <= MAX_INT:
        raise ManifestError(
            f"manifest entry {str(entry.get('key'))[:200]!r}: {name} "
            f"{str(value)[:40]!r} is not an integer in [{low}, 2^63)"
        )
    return value


def _entry(index: int, raw: object) -> Entry:
    """One entry, every field checked (types, ranges, key syntax, digest form)."""
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest entry {index} is a {type(raw).__name__}, not an object")
    if "parts" in raw:
        return _parts_entry(index, raw)
    missing, unknown = _REQUIRED - raw.keys(), raw.keys() - _FIELDS
    if missing or unknown:
        raise ManifestError(f"manifest entry {index}: missing {sorted(missing)}, unknown {sorted(unknown)[:5]}")
    key, kind, sha = raw["key"], raw["kind"], raw["sha256"]
    try:
        validate_key(key)
    except InvalidKey as exc:
        raise ManifestError(f"manifest entry {index}: {exc}") from None
    if kind not in KINDS:
        raise ManifestError(f"manifest entry {key!r}: kind {str(kind)[:40]!r} is not one of {KINDS}")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise ManifestError(f"manifest entry {key!r}: sha256 {str(sha)[:80]!r} is not 64 lowercase hex digits")
    base = None if raw["base"] is None else _int(raw, "base", 0)
    piece = _int(raw, "piece_bytes", 0) if "piece_bytes" in raw else 0
    _check_piece(piece, f"manifest entry {key!r}")
    files = _files(key, kind, raw.get("files", []))
    catchup = raw.get("catchup", False)
    if type(catchup) is not bool:
        raise ManifestError(f"manifest entry {key!r}: catchup {str(catchup)[:40]!r} is not true or false")
    return Entry(
        _int(raw, "version", 0),
        kind,
        base,
        key,
        _int(raw, "size", 1),
        sha,
        _int(raw, "raw_bytes", 0) if "raw_bytes" in raw else 0,
        piece,
        _int(raw, "published_at_ms", 0) if "published_at_ms" in raw else 0,
        files,
        catchup,
    )


def _files(key: str, kind: str, raw: object) -> tuple[SideFile, ...]:
    """An entry's side files, each checked: a plain name (never a path, never a weights
    file), a valid key, a size, a digest; at most MAX_SIDE_FILES, names unique."""
    if not isinstance(raw, list) or len(raw) > MAX_SIDE_FILES:
        raise ManifestError(f"manifest entry {key!r}: files is not a list of at most {MAX_SIDE_FILES} objects")
    if raw and kind != "snapshot":
        raise ManifestError(f"manifest entry {key!r}: a {kind} lists files; only snapshots do")
    out = []
    for f in raw:
        if not isinstance(f, dict) or f.keys() != _FILE_FIELDS:
            raise ManifestError(f"manifest entry {key!r}: a file is not an object of {sorted(_FILE_FIELDS)}")
        name, sha = f["name"], f["sha256"]
        if not isinstance(name, str) or not _FILE_NAME.match(name) or name.endswith(".safetensors"):
            raise ManifestError(
                f"manifest entry {key!r}: file name {str(name)[:80]!r} is not "
                "a plain file name (letters, digits, _ . = + -; no "
                ".safetensors)"
            )
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise ManifestError(f"manifest entry {key!r}: file {name!r} has no valid sha256")
        try:
            validate_key(f["key"])
        except InvalidKey as exc:
            raise ManifestError(f"manifest entry {key!r}: file {name!r}: {exc}") from None
        out.append(SideFile(name, f["key"], _int(f, "size", 0), sha))
    if len({f.name for f in out}) != len(out):
        raise ManifestError(f"manifest entry {key!r}: a file name is listed twice")
    return tuple(out)


def _retention(raw: object) -> Retention | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.keys() != {"keep_anchors", "removed_through"}:
        raise ManifestError("malformed manifest: retention is not an object of keep_anchors and removed_through")
    removed = None if raw["removed_through"] is None else _int(raw, "removed_through", 0)
    return Retention(_int(raw, "keep_anchors", 0), removed)


def _boot(doc: dict) -> int | None:
    if doc.get("boot") is None:
        return None
    if doc["format"] != FORMAT_BOOT:
        raise ManifestError(f"malformed manifest: a {doc['format']} manifest with a boot version")
    boot = doc["boot"]
    if type(boot) is not int or not 0 <= boot <= MAX_INT:
        raise ManifestError(f"malformed manifest: boot {str(boot)[:40]!r} is not an integer in [0, 2^63)")
    return boot


def _several_deltas(entries: tuple[Entry, ...]) -> set[int]:
    """The versions that have more than one delta."""
    seen: set[int] = set()
    several: set[int] = set()
    for e in entries:
        if e.kind == "delta":
            (several if e.version in seen else seen).add(e.version)
    return several


def _check_piece(piece: int, where: str) -> None:
    if piece and not (MIN_PIECE <= piece <= MAX_PIECE and piece & (piece - 1) == 0):
        raise ManifestError(f"{where}: piece_bytes {piece} is not 0 or a power of two in [{MIN_PIECE}, {MAX_PIECE}]")


def _parts_entry(index: int, raw: dict) -> Entry:
    """An entry made of parts, every field checked (the parts' covers disjoint)."""
    missing, unknown = (_PARTS_FIELDS - {"raw_bytes", "published_at_ms"}) - raw.keys(), raw.keys() - _PARTS_FIELDS
    if missing or unknown:
        raise ManifestError(
            f"manifest entry {index} (with parts): missing {sorted(missing)}, unknown "
            f"{sorted(unknown)[:5]} (an entry has parts or a key, not both)"
        )
    kind, parts = raw["kind"], raw["parts"]
    if kind not in KINDS:
        raise ManifestError(f"manifest entry {index}: kind {str(kind)[:40]!r} is not one of {KINDS}")
    if not isinstance(parts, list) or not parts:
        raise ManifestError(f"manifest entry {index}: parts is not a non-empty list")
    where = f"manifest entry {index}"
    parsed = tuple(parse_part(p, where, _check_piece) for p in parts)
    check_covers(parsed, where)
    base = None if raw["base"] is None else _int(raw, "base", 0)
    return parts_entry(
        _int(raw, "version", 0),
        kind,
        base,
        parsed,
        _int(raw, "raw_bytes", 0) if "raw_bytes" in raw else 0,
        _int(raw, "published_at_ms", 0) if "published_at_ms" in raw else 0,
    )


def _model(model: object) -> dict:
    if not isinstance(model, dict):
        raise ManifestError(f"malformed manifest: model is a {type(model).__name__}, not an object")
    return model


def entry_order(e: Entry) -> tuple[int, int, int]:
    """Where `e` goes in a manifest's entries: by version, then kind (deltas before the
    snapshot), then base (a catch-up delta before the version's step delta)."""
    return e.version, KINDS.index(e.kind), -1 if e.base is None else e.base


def checked(manifest: Manifest) -> Manifest:
    """Return `manifest` if its entries are consistent, else raise ManifestError."""
    keys = set()
    for i, e in enumerate(manifest.entries):
        if e.kind not in KINDS or (e.kind == "delta") != (e.base is not None):
            raise ManifestError(f"entry {e.key!r}: kind {e.kind!r} with base {e.base!r}")
        if e.base is not None and e.base >= e.version:
            raise ManifestError(f"entry {e.key!r}: delta to {e.version} from later base {e.base}")
        if e.catchup and (e.kind != "delta" or e.base is None or e.base != manifest.boot):
            raise ManifestError(
                f"entry {e.key!r}: a catch-up {e.kind} from {e.base}, not a delta from the boot version {manifest.boot}"
            )
        if i and entry_order(e) <= entry_order(manifest.entries[i - 1]):
            raise ManifestError(f"entry {e.key!r} (version {e.version} {e.kind}) is out of order or duplicated")
        for key in e.keys:
            if key in keys:
                raise ManifestError(f"key {key!r} is listed twice")
            keys.add(key)
    return manifest


def object_key(version: int, kind: str, base: int | None, data: bytes, digest: str | None = None) -> str:
    """A key that names the object's bytes: version, kind, base and a content hash
    (`digest`, the object's tree hash, where the caller has it)."""
    digest = digest or tree_sha256(data)
    middle = f"delta-from-{base:010d}" if kind == "delta" else "snapshot"
    return f"packs/{version:010d}/{middle}-{digest[:20]}.pack"


def make_entry(version: int, kind: str, base: int | None, data: bytes, raw_bytes: int) -> Entry:
    """The manifest entry of a freshly encoded object (its bytes hashed once, in parallel)."""
    digest = tree_sha256(data, PIECE_BYTES)
    return Entry(
        version, kind, base, object_key(version, kind, base, data, digest), len(data), digest, raw_bytes, PIECE_BYTES
    )


def side_file(name: str, data: bytes) -> SideFile:
    """The record of a side file, under a key that names its bytes (shared by every
    anchor that carries the same file)."""
    digest = hashlib.sha256(data).hexdigest()
    return SideFile(name, f"files/{digest[:32]}/{name}", len(data), digest)
