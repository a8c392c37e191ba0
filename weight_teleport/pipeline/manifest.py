"""The manifest: the store's one mutable object, a JSON log of immutable packs.

Every published version has an entry per object: a "delta" from its base version, and
at anchors a "snapshot" too (the first version has only the snapshot). Entries are
ordered by version (a delta before the snapshot of the same version); keys are unique
and content-addressed, so a key is never reused for other bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable

from weight_teleport.pipeline.errors import ManifestError
from weight_teleport.store.errors import InvalidKey
from weight_teleport.store.hashing import PIECE_BYTES, tree_sha256
from weight_teleport.store.keys import validate_key

FORMAT = "weight-teleport-manifest/1"
KINDS = ("delta", "snapshot")
MAX_MANIFEST_BYTES = 16 << 20
"""Largest manifest parsed (the origin's default `max_manifest_bytes`): about 60 k entries."""
MAX_INT = (1 << 63) - 1
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_TOP_REQUIRED = {"format", "latest", "model", "entries"}

Signer = Callable[[bytes], dict]
"""Canonical bytes -> the manifest's "signature" member."""
Verifier = Callable[[bytes, object], None]
"""(canonical bytes, the "signature" member or None) -> None, or ManifestSignatureError."""


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


_FIELDS = {f.name for f in fields(Entry)}
_REQUIRED = _FIELDS - {"raw_bytes", "piece_bytes"}
MIN_PIECE, MAX_PIECE = 1 << 16, 1 << 30
"""The piece sizes a reader accepts (powers of two)."""


@dataclass(frozen=True)
class Manifest:
    """The versions a store holds, in order."""

    entries: tuple[Entry, ...] = ()
    model: dict = field(default_factory=dict)
    """Free-form description of the weights (names, dtypes), for people and `status`."""

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

    def with_entries(self, *entries: Entry) -> "Manifest":
        """A new manifest with `entries` appended (checked)."""
        return checked(replace(self, entries=self.entries + tuple(entries)))

    def to_json(self, sign: Signer | None = None) -> bytes:
        """The manifest as the bytes stored in the store; `sign` (signing.ManifestSigner)
        adds a "signature" member over its canonical bytes (docs/FORMAT.md, Manifest)."""
        doc = {"format": FORMAT, "latest": self.latest, "model": self.model,
               "entries": [asdict(e) for e in self.entries]}
        if sign is not None:
            doc["signature"] = sign(canonical_bytes(doc))
        return json.dumps(doc, indent=1, sort_keys=True).encode()


def canonical_bytes(doc: dict) -> bytes:
    """The bytes a manifest's signature covers: the document without its "signature"
    member, as compact JSON with sorted keys, in ASCII (non-ASCII characters escaped).
    Manifests hold no floats (the parser refuses them), so these bytes are one function
    of the parsed document."""
    unsigned = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def from_json(data: bytes, *, verify: Verifier | None = None,
              max_bytes: int = MAX_MANIFEST_BYTES) -> Manifest:
    """Parse and check a stored manifest; raise ManifestError if it is not a valid one.

    Untrusted input: the size is checked before parsing, every field's type and range
    after, and nothing but ManifestError escapes. `verify` (signing.ManifestVerifier)
    checks the signature before the entries are read; it raises ManifestSignatureError."""
    if len(data) > max_bytes:
        raise ManifestError(f"the manifest is {len(data)} bytes, over the {max_bytes}-byte "
                            "limit: not a manifest this library wrote")
    doc = _parse(data)
    if verify is not None:
        verify(canonical_bytes(doc), doc.get("signature"))
    entries = doc["entries"]
    if not isinstance(entries, list):
        raise ManifestError(f"malformed manifest: entries is a {type(entries).__name__}, not a list")
    manifest = checked(Manifest(tuple(_entry(i, e) for i, e in enumerate(entries)),
                                _model(doc["model"])))
    if doc["latest"] != manifest.latest or isinstance(doc["latest"], bool):
        raise ManifestError(f"malformed manifest: latest is {str(doc['latest'])[:40]!r}, its last "
                            f"entry is version {manifest.latest}")
    return manifest


def _parse(data: bytes) -> dict:
    """The manifest's top-level object: JSON without floats, NaNs or repeated keys."""
    try:
        doc = json.loads(data, parse_float=_no_float, parse_constant=_no_float,
                         object_pairs_hook=_unique)
    except ManifestError:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ManifestError(f"malformed manifest: not JSON ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"malformed manifest: a JSON {type(doc).__name__}, not an object")
    if doc.get("format") != FORMAT:
        raise ManifestError(f"not a {FORMAT} manifest (format {str(doc.get('format'))[:100]!r})")
    missing, unknown = _TOP_REQUIRED - doc.keys(), doc.keys() - _TOP_REQUIRED - {"signature"}
    if missing or unknown:
        raise ManifestError(f"malformed manifest: missing {sorted(missing)}, unknown "
                            f"{sorted(unknown)[:5]}")
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
        raise ManifestError(f"manifest entry {str(entry.get('key'))[:200]!r}: {name} "
                            f"{str(value)[:40]!r} is not an integer in [{low}, 2^63)")
    return value


def _entry(index: int, raw: object) -> Entry:
    """One entry, every field checked (types, ranges, key syntax, digest form)."""
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest entry {index} is a {type(raw).__name__}, not an object")
    missing, unknown = _REQUIRED - raw.keys(), raw.keys() - _FIELDS
    if missing or unknown:
        raise ManifestError(f"manifest entry {index}: missing {sorted(missing)}, unknown "
                            f"{sorted(unknown)[:5]}")
    key, kind, sha = raw["key"], raw["kind"], raw["sha256"]
    try:
        validate_key(key)
    except InvalidKey as exc:
        raise ManifestError(f"manifest entry {index}: {exc}") from None
    if kind not in KINDS:
        raise ManifestError(f"manifest entry {key!r}: kind {str(kind)[:40]!r} is not one of {KINDS}")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise ManifestError(f"manifest entry {key!r}: sha256 {str(sha)[:80]!r} is not 64 "
                            "lowercase hex digits")
    base = None if raw["base"] is None else _int(raw, "base", 0)
    piece = _int(raw, "piece_bytes", 0) if "piece_bytes" in raw else 0
    if piece and not (MIN_PIECE <= piece <= MAX_PIECE and piece & (piece - 1) == 0):
        raise ManifestError(f"manifest entry {key!r}: piece_bytes {piece} is not 0 or a power "
                            f"of two in [{MIN_PIECE}, {MAX_PIECE}]")
    return Entry(_int(raw, "version", 0), kind, base, key, _int(raw, "size", 1), sha,
                 _int(raw, "raw_bytes", 0) if "raw_bytes" in raw else 0, piece)


def _model(model: object) -> dict:
    if not isinstance(model, dict):
        raise ManifestError(f"malformed manifest: model is a {type(model).__name__}, not an object")
    return model


def _order(e: Entry) -> tuple[int, int]:
    return e.version, KINDS.index(e.kind)


def checked(manifest: Manifest) -> Manifest:
    """Return `manifest` if its entries are consistent, else raise ManifestError."""
    keys = set()
    for i, e in enumerate(manifest.entries):
        if e.kind not in KINDS or (e.kind == "delta") != (e.base is not None):
            raise ManifestError(f"entry {e.key!r}: kind {e.kind!r} with base {e.base!r}")
        if e.base is not None and e.base >= e.version:
            raise ManifestError(f"entry {e.key!r}: delta to {e.version} from later base {e.base}")
        if i and _order(e) <= _order(manifest.entries[i - 1]):
            raise ManifestError(f"entry {e.key!r} (version {e.version} {e.kind}) is out of order "
                                "or duplicated")
        if e.key in keys:
            raise ManifestError(f"key {e.key!r} is listed twice")
        keys.add(e.key)
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
    return Entry(version, kind, base, object_key(version, kind, base, data, digest), len(data),
                 digest, raw_bytes, PIECE_BYTES)
