"""Errors raised by object stores: each one says what went wrong and what to do."""

from __future__ import annotations

from weight_teleport.errors import WeightTeleportError


class StoreError(WeightTeleportError):
    """Base class of every error raised by a store."""


class NotFound(StoreError, KeyError):
    """The object (or manifest) does not exist in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class InvalidKey(StoreError, ValueError):
    """A key is malformed or would land outside the store's root."""


class AuthError(StoreError):
    """The store refused the credentials (a missing or wrong token, no write access)."""


class TooLarge(StoreError):
    """The object is larger than the store accepts, or than the reader allows
    (`Store.get(key, max_bytes=...)`): reading stopped there."""


class Conflict(StoreError):
    """An immutable object already exists under this key with different bytes."""


class ManifestChanged(Conflict):
    """A conditional manifest write found another manifest than the one it expected:
    another writer replaced it since it was read."""


class StoreFull(StoreError):
    """The store has no space left (a full disk or quota): free space, then retry."""


class TransportError(StoreError):
    """A transient failure (network, server busy): the operation may succeed if retried."""


class RangeIgnored(TransportError):
    """A ranged read was answered with the whole object from its first byte (a cache or
    proxy that ignores `Range`, or a hostile store): refused rather than read through to
    the range. Retried like any transient failure; a cache that keeps ignoring ranges must
    be configured to pass them on (docs/DEPLOY.md)."""


class MissingDependency(StoreError, ImportError):
    """A store needs an optional package that is not installed."""
