"""Object keys and manifest ETags: the rules every store and the origin server share."""

from __future__ import annotations

import hashlib
import re

from .errors import InvalidKey, ManifestChanged
from .hashing import tree_sha256

MAX_KEY_LENGTH = 1024
MAX_SEGMENT_LENGTH = 255
"""The longest file name most filesystems take (NAME_MAX): every store refuses longer
segments, so that a key valid in one store is valid in all."""
# One path segment: no leading dot (so no "." / ".." and no hidden temp files).
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]*\Z")


def validate_key(key: str) -> str:
    """Return `key` if it is a valid object key, else raise InvalidKey.

    A key is a relative, "/"-separated path of segments made of letters, digits and
    `_ . = + -`, none starting with a dot nor longer than 255 characters: it can never
    escape a store's root.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"invalid key {key!r}: expected a non-empty str of at most {MAX_KEY_LENGTH} characters")
    for segment in key.split("/"):
        if not _SEGMENT.match(segment):
            raise InvalidKey(
                f"invalid key {key!r}: segment {segment!r} must match "
                f"[A-Za-z0-9_][A-Za-z0-9_.=+-]* (no '..', no absolute paths, no empty "
                f"segments)"
            )
        if len(segment) > MAX_SEGMENT_LENGTH:
            raise InvalidKey(
                f"invalid key {key[:40]!r}...: a segment of {len(segment)} "
                f"characters; at most {MAX_SEGMENT_LENGTH} (a file name's limit)"
            )
    return key


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if it is empty or could start a valid key, else raise InvalidKey."""
    if prefix:
        validate_key(prefix.rstrip("/") or "/")
    return prefix


def content_hash(data) -> str:
    """The content address of an object's bytes: their hex SHA-256 tree (`hashing`), what
    the origin's URLs and the X-Content-Tree-SHA256 header carry."""
    return tree_sha256(data)


def manifest_etag(manifest: bytes) -> str:
    """The ETag of a manifest: what `Store.watch(after=...)` and
    `Store.put_manifest(if_match=...)` compare against: the manifest's hex SHA-256."""
    return hashlib.sha256(manifest).hexdigest()


def check_manifest_etag(current: bytes | None, if_match: str | None) -> None:
    """Raise ManifestChanged unless `current` (the stored manifest, None if there is
    none) is the manifest `if_match` names: its ETag, or None for "no manifest yet"."""
    found = None if current is None else manifest_etag(current)
    if found != if_match:
        raise ManifestChanged(describe_manifest_change(if_match, found))


def describe_manifest_change(expected: str | None, found: str | None) -> str:
    """The message of a failed conditional manifest write."""

    def name(etag: str | None) -> str:
        return "no manifest" if etag is None else f"ETag {etag[:16]}..."

    return (
        f"the manifest changed since it was read (expected {name(expected)}, found "
        f"{name(found)}): another writer updated the store meanwhile"
    )
