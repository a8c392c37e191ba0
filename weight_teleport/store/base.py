"""The store contract: immutable blobs under keys plus one small mutable manifest.

A store implements the underscore primitives only. Key checks, retries with backoff,
size bounds and change notification by polling live here, once.
"""

from __future__ import annotations

import builtins
import enum
import logging
import random
import time
from typing import TYPE_CHECKING, Callable, Final, TypeVar, Union

if TYPE_CHECKING:  # numpy is imported where ranges are read (the CLI starts without it)
    import numpy as np

from .config import StoreConfig
from .errors import ManifestChanged, TooLarge, TransportError
from .keys import manifest_etag, validate_key, validate_prefix

T = TypeVar("T")
log = logging.getLogger(__name__)


class _Unconditional(enum.Enum):
    # an enum's one member: `if_match is UNCONDITIONAL` narrows IfMatch for the type checker,
    # and the sentinel is still itself after a pickle round trip
    UNCONDITIONAL = "UNCONDITIONAL"

    def __repr__(self) -> str:
        return "UNCONDITIONAL"

    __str__ = __repr__


UNCONDITIONAL: Final = _Unconditional.UNCONDITIONAL
"""`put_manifest(data, if_match=UNCONDITIONAL)` (the default) replaces any manifest."""
IfMatch = Union[str, None, _Unconditional]


def too_large(key: str, max_bytes: int) -> TooLarge:
    """The error of a read that got more than `max_bytes` bytes of `key`."""
    return TooLarge(
        f"{key!r} is larger than the {max_bytes} bytes allowed; reading stopped there (a wrong or hostile store)"
    )


class Store:
    """An object store of immutable blobs and one atomically replaced manifest.

    Keys are written once and never reused: writing other bytes under an existing key
    raises Conflict, and a deleted key must not come back with other bytes (readers and
    HTTP caches may still hold the old ones).

    Subclasses implement `_put`, `_get`, `_get_range`, `_list`, `_delete`,
    `_put_manifest` and `_get_manifest`; they raise `TransportError` for failures worth
    retrying and the other `errors` for the rest. `_put_manifest(data, if_match)`
    compares and swaps atomically. They may override `_watch`, `_check_write`, and
    `_get_at_most`, which should stop reading once more than `max_bytes` arrived.
    """

    parallel_ranges = False
    """Whether ranged reads of one object may run on several threads at once and cost no
    more in all than one read of it (readers then fetch large objects in parallel ranges)."""

    def __init__(self, config: StoreConfig | None = None):
        self.config = config or StoreConfig()

    # Public API: checks, retries, then the primitive.
    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_hash: str | None = None,
        between_pieces: Callable[[], None] | None = None,
    ) -> None:
        """Store `data` (any bytes-like object) under `key`; readers see all of it or
        nothing. Stores that keep the bytes copy them; the others send them from where
        they are (a pack in pinned memory is not copied into a `bytes` first).

        `content_hash`: the tree hash of `data` (`store.hashing`, `PIECE_BYTES` pieces) where
        the caller has it already: a store that sends one along (HTTP) uses it instead of
        hashing the bytes again, and its server refuses the upload if it is wrong.

        `between_pieces`: called between the pieces of a streamed upload (HTTP), where it
        may block for a few seconds to let other uploads go first; stores that write in
        one step do not call it."""
        self._retry(self._put_with, validate_key(key), memoryview(data).cast("B"), content_hash, between_pieces)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Return the bytes under `key`; raise NotFound if there are none.

        With `max_bytes`, raise TooLarge as soon as more than that many bytes arrive
        (an object bigger than its manifest entry says is refused without reading it).
        """
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
        if max_bytes is None:
            return self._retry(self._get, validate_key(key))
        data = self._retry(self._get_at_most, validate_key(key), max_bytes)
        if len(data) > max_bytes:
            raise too_large(key, max_bytes)
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return `get(key)[start:end]` (end exclusive, clipped to the object's size)."""
        if not 0 <= start <= end:
            raise ValueError(f"invalid range [{start}, {end}): need 0 <= start <= end")
        if start == end:
            return b""
        return self._retry(self._get_range, validate_key(key), start, end)

    def get_range_into(self, key: str, start: int, out: np.ndarray) -> int:
        """Read `get(key)[start:start + len(out)]` into `out` (a writable uint8 array) and
        return how many bytes came (fewer at the object's end). Stores that hold the bytes
        copy them straight in, on the calling thread without the GIL; the others read the
        range first."""
        if start < 0:
            raise ValueError(f"invalid range start {start}: need 0 <= start")
        if len(out) == 0:
            return 0
        return self._retry(self._get_range_into, validate_key(key), start, out)

    def list(self, prefix: str = "") -> list[str]:
        """Return the sorted keys that start with `prefix`."""
        return sorted(self._retry(self._list, validate_prefix(prefix)))

    def delete(self, key: str) -> None:
        """Remove `key`; raise NotFound if it does not exist."""
        self._retry(self._delete, validate_key(key))

    def put_manifest(self, data: bytes, *, if_match: IfMatch = UNCONDITIONAL) -> None:
        """Replace the manifest atomically: readers see the old one or the new one.

        `if_match` makes the write conditional: the ETag (`manifest_etag`) of the
        manifest the writer read, or None if it read none. If the store holds another
        one, nothing is written and ManifestChanged is raised: another writer was first.
        """
        data = bytes(data)
        try:
            self._retry(self._put_manifest, data, if_match)
        except ManifestChanged:
            # A retried write whose first try went through (its answer lost) finds itself.
            if self._retry(self._get_manifest) != data:
                raise

    def get_manifest(self) -> bytes | None:
        """Return the manifest, or None if none was ever written.

        Raises TooLarge above `StoreConfig.max_manifest_bytes`.
        """
        return self._check_manifest_size(self._retry(self._get_manifest))

    def check_write_access(self) -> None:
        """Raise AuthError (or another StoreError) now if this store will refuse writes
        (a wrong token, a read-only directory): a cheap probe, before any upload."""
        self._retry(self._check_write)

    def watch(self, after: str | None = None, timeout: float = 30.0) -> bytes | None:
        """Wait until the manifest differs from the one whose ETag is `after`.

        `after` is `manifest_etag(old_manifest)`, or None to wait for any manifest.
        Return the new manifest as soon as it is there, or None after `timeout` seconds.
        """
        return self._check_manifest_size(self._watch(after, time.monotonic() + timeout))

    def _check_manifest_size(self, manifest: bytes | None) -> bytes | None:
        limit = self.config.max_manifest_bytes
        if manifest is not None and len(manifest) > limit:
            raise TooLarge(
                f"the store's manifest has {len(manifest)} bytes, more than StoreConfig.max_manifest_bytes ({limit})"
            )
        return manifest

    def close(self) -> None:
        """Release connections; the store must not be used afterwards."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Primitives.
    def _put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _put_with(
        self, key: str, data: bytes, content_hash: str | None, between_pieces: Callable[[], None] | None
    ) -> None:
        """`_put` told what the caller knows (see `put`); stores that neither send a hash
        nor stream an upload in pieces ignore both."""
        self._put(key, data)

    def _get(self, key: str) -> bytes:
        raise NotImplementedError

    def _get_at_most(self, key: str, max_bytes: int) -> bytes:
        """The object, or a prefix of it longer than `max_bytes` (then refused); this
        default reads it all first, stores that stream override it."""
        return self._get(key)

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        raise NotImplementedError

    def _get_range_into(self, key: str, start: int, out: np.ndarray) -> int:
        import numpy as np

        part = self._get_range(key, start, start + len(out))
        out[: len(part)] = np.frombuffer(part, np.uint8)
        return len(part)

    def _list(self, prefix: str) -> builtins.list[str]:  # `list` here is Store.list
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError

    def _put_manifest(self, data: bytes, if_match: IfMatch) -> None:
        raise NotImplementedError

    def _get_manifest(self) -> bytes | None:
        raise NotImplementedError

    def _check_write(self) -> None:
        """Stores whose writes can be refused probe them here."""

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
                log.debug("%s failed (%s); retry %d/%d in %.2fs", op.__name__, exc, attempt, retry.attempts - 1, delay)
                time.sleep(delay * (0.5 + random.random() / 2))
                delay, attempt = min(delay * 2, retry.backoff_max_s), attempt + 1
