"""The manifest: the store's one mutable object, a JSON log of immutable packs.

Every published version has an entry per object: a "delta" from its base version, and
at anchors a "snapshot" too (the first version has only the snapshot). Entries are
ordered by version (a delta before the snapshot of the same version); keys are unique
and content-addressed, so a key is never reused for other bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from weight_teleport.pipeline.errors import ManifestError

FORMAT = "weight-teleport-manifest/1"
KINDS = ("delta", "snapshot")


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
    """Hex SHA-256 of the object's bytes."""
    raw_bytes: int = 0
    """Bytes of the weights the object describes (for ratios)."""


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

    def to_json(self) -> bytes:
        """The manifest as the bytes stored in the store."""
        doc = {"format": FORMAT, "latest": self.latest, "model": self.model,
               "entries": [asdict(e) for e in self.entries]}
        return json.dumps(doc, indent=1, sort_keys=True).encode()


def from_json(data: bytes) -> Manifest:
    """Parse and check a stored manifest; raise ManifestError if it is not one."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ManifestError(f"not a {FORMAT} manifest (format {doc.get('format')!r})")
        entries = tuple(Entry(**e) for e in doc["entries"])
        manifest = Manifest(entries, doc.get("model") or {})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(f"malformed manifest: {exc}") from None
    return checked(manifest)


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


def object_key(version: int, kind: str, base: int | None, data: bytes) -> str:
    """A key that names the object's bytes: version, kind, base and a content hash."""
    digest = hashlib.sha256(data).hexdigest()
    middle = f"delta-from-{base:010d}" if kind == "delta" else "snapshot"
    return f"packs/{version:010d}/{middle}-{digest[:20]}.pack"


def make_entry(version: int, kind: str, base: int | None, data: bytes, raw_bytes: int) -> Entry:
    """The manifest entry of a freshly encoded object."""
    return Entry(version, kind, base, object_key(version, kind, base, data), len(data),
                 hashlib.sha256(data).hexdigest(), raw_bytes)
