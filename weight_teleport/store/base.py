"""The store contract: immutable blobs under keys plus one small mutable manifest.

A store implements the underscore primitives only. Key checks, retries with backoff
and change notification by polling live here, once.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from .config import StoreConfig
from .errors import TransportError
from .keys import manifest_etag, validate_key, validate_prefix

T = TypeVar("T")
log = logging.getLogger(__name__)


class Store:
    """An object store of immutable blobs and one atomically replaced manifest.

    Keys are written once and never reused: writing other bytes under an existing key
    raises Conflict, and a deleted key must not come back with other bytes (readers and
    HTTP caches may still hold the old ones).

    Subclasses implement `_put`, `_get`, `_get_range`, `_list`, `_delete`,
    `_put_manifest` and `_get_manifest`; they raise `TransportError` for failures worth
    retrying and the other `errors` for the rest. They may override `_watch`.
    """

    def __init__(self, config: StoreConfig | None = None):
        self.config = config or StoreConfig()

    # Public API: checks, retries, then the primitive.
    def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key`; readers see all of it or nothing."""
        self._retry(self._put, validate_key(key), bytes(data))

    def get(self, key: str) -> bytes:
        """Return the bytes under `key`; raise NotFound if there are none."""
        return self._retry(self._get, validate_key(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return `get(key)[start:end]` (end exclusive, clipped to the object's size)."""
        if not 0 <= start <= end:
            raise ValueError(f"invalid range [{start}, {end}): need 0 <= start <= end")
        if start == end:
            return b""
        return self._retry(self._get_range, validate_key(key), start, end)

    def list(self, prefix: str = "") -> list[str]:
        """Return the sorted keys that start with `prefix`."""
        return sorted(self._retry(self._list, validate_prefix(prefix)))

    def delete(self, key: str) -> None:
        """Remove `key`; raise NotFound if it does not exist."""
        self._retry(self._delete, validate_key(key))

    def put_manifest(self, data: bytes) -> None:
        """Replace the manifest atomically: readers see the old one or the new one."""
        self._retry(self._put_manifest, bytes(data))

    def get_manifest(self) -> bytes | None:
        """Return the manifest, or None if none was ever written."""
        return self._retry(self._get_manifest)

    def watch(self, after: str | None = None, timeout: float = 30.0) -> bytes | None:
        """Wait until the manifest differs from the one whose ETag is `after`.

        `after` is `manifest_etag(old_manifest)`, or None to wait for any manifest.
        Return the new manifest as soon as it is there, or None after `timeout` seconds.
        """
        return self._watch(after, time.monotonic() + timeout)

    def close(self) -> None:
        """Release connections; the store must not be used afterwards."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Primitives.
    def _put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _get(self, key: str) -> bytes:
        raise NotImplementedError

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        raise NotImplementedError

    def _list(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError

    def _put_manifest(self, data: bytes) -> None:
        raise NotImplementedError

    def _get_manifest(self) -> bytes | None:
        raise NotImplementedError

    def _watch(self, after: str | None, deadline: float) -> bytes | None:
        """Poll the manifest with a doubling interval until it changes or time is up."""
        delay = self.config.watch_poll_s
        while True:
            manifest = self.get_manifest()
            if manifest is not None and manifest_etag(manifest) != after:
                return manifest
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, self.config.watch_poll_max_s)

    def _retry(self, op: Callable[..., T], *args: object) -> T:
        """Run `op(*args)`, retrying TransportError with exponential backoff."""
        retry = self.config.retry
        delay, attempt = retry.backoff_s, 1
        while True:
            try:
                return op(*args)
            except TransportError as exc:
                if attempt >= retry.attempts:
                    raise
                log.debug("%s failed (%s); retry %d/%d in %.2fs", op.__name__, exc,
                          attempt, retry.attempts - 1, delay)
                time.sleep(delay * (0.5 + random.random() / 2))
                delay, attempt = min(delay * 2, retry.backoff_max_s), attempt + 1
