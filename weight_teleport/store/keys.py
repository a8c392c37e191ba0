"""Object keys and manifest ETags: the rules every store and the origin server share."""

from __future__ import annotations

import hashlib
import re

from .errors import InvalidKey

MAX_KEY_LENGTH = 1024
# One path segment: no leading dot (so no "." / ".." and no hidden temp files).
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]*\Z")


def validate_key(key: str) -> str:
    """Return `key` if it is a valid object key, else raise InvalidKey.

    A key is a relative, "/"-separated path of segments made of letters, digits and
    `_ . = + -`, none starting with a dot: it can never escape a store's root.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"invalid key {key!r}: expected a non-empty str of at most "
                         f"{MAX_KEY_LENGTH} characters")
    for segment in key.split("/"):
        if not _SEGMENT.match(segment):
            raise InvalidKey(
                f"invalid key {key!r}: segment {segment!r} must match "
                f"[A-Za-z0-9_][A-Za-z0-9_.=+-]* (no '..', no absolute paths, no empty "
                f"segments)")
    return key


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if it is empty or could start a valid key, else raise InvalidKey."""
    if prefix:
        validate_key(prefix.rstrip("/") or "/")
    return prefix


def content_hash(data: bytes) -> str:
    """Hex SHA-256 of `data`: content addresses and manifest ETags."""
    return hashlib.sha256(data).hexdigest()


def manifest_etag(manifest: bytes) -> str:
    """The ETag of a manifest: what `Store.watch(after=...)` compares against."""
    return content_hash(manifest)
