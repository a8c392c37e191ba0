"""`memory://NAME`: an in-process store; stores opened with the same name share data."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where ranges are read (the CLI starts without it)
    import numpy as np

from .base import UNCONDITIONAL, IfMatch, Store
from .config import StoreConfig
from .errors import Conflict, NotFound
from .keys import check_manifest_etag, manifest_etag


@dataclass
class _Shared:
    objects: dict[str, bytes] = field(default_factory=dict)
    manifest: bytes | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)


_NAMES: dict[str, _Shared] = {}
_NAMES_LOCK = threading.Lock()


class MemoryStore(Store):
    """A store held in this process's memory, for tests and same-process use."""

    parallel_ranges = True

    def __init__(self, name: str | None, config: StoreConfig | None = None):
        """Open the store called `name` (created empty if new); None makes a private one."""
        super().__init__(config)
        if name is None:
            self._shared = _Shared()
            return
        with _NAMES_LOCK:
            self._shared = _NAMES.setdefault(name, _Shared())

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None) -> "MemoryStore":
        """Open `memory://NAME`."""
        return cls(url.partition("://")[2], config)

    def _put(self, key: str, data: bytes) -> None:
        data = bytes(data)  # kept: the caller may reuse its buffer
        with self._shared.changed:
            if self._shared.objects.setdefault(key, data) != data:
                raise Conflict(
                    f"object {key!r} already exists with different bytes; objects are immutable: write under a new key"
                )

    def _get(self, key: str) -> bytes:
        with self._shared.changed:
            try:
                return self._shared.objects[key]
            except KeyError:
                raise NotFound(f"no object {key!r} in memory store") from None

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        return self._get(key)[start:end]

    def _get_range_into(self, key: str, start: int, out: np.ndarray) -> int:
        import numpy as np

        data = self._get(key)  # immutable bytes: copied after the lock is released
        count = max(0, min(len(out), len(data) - start))
        if count:
            out[:count] = np.frombuffer(data, np.uint8, count, start)  # numpy drops the GIL
        return count

    def _list(self, prefix: str) -> list[str]:
        with self._shared.changed:
            return [k for k in self._shared.objects if k.startswith(prefix)]

    def _delete(self, key: str) -> None:
        with self._shared.changed:
            if self._shared.objects.pop(key, None) is None:
                raise NotFound(f"no object {key!r} in memory store")

    def _put_manifest(self, data: bytes, if_match: IfMatch = UNCONDITIONAL) -> None:
        with self._shared.changed:
            if if_match is not UNCONDITIONAL:
                check_manifest_etag(self._shared.manifest, if_match)
            self._shared.manifest = data
            self._shared.changed.notify_all()

    def _get_manifest(self) -> bytes | None:
        with self._shared.changed:
            return self._shared.manifest

    def _watch(self, after: str | None, deadline: float) -> bytes | None:
        """Wake up on the writer's notification instead of polling."""

        def changed() -> bool:
            m = self._shared.manifest
            return m is not None and manifest_etag(m) != after

        with self._shared.changed:
            if self._shared.changed.wait_for(changed, max(0.0, deadline - time.monotonic())):
                return self._shared.manifest
            return None
