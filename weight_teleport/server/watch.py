"""The manifest as the origin sees it: current bytes, ETag, and long-poll wake-ups."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..store.keys import manifest_etag


class ManifestWatch:
    """Reads the manifest file (re-reading only when it changed on disk) and wakes
    long-polls when the server replaces it."""

    def __init__(self, path: Path, disk_check_s: float):
        self.path = path
        self.disk_check_s = disk_check_s
        self._cached: tuple[tuple[int, int, int], bytes, str] | None = None
        self._event = asyncio.Event()

    def current(self) -> tuple[bytes, str] | None:
        """The manifest's bytes and ETag, or None if there is no manifest."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._cached is None or self._cached[0] != stamp:
            data = self.path.read_bytes()
            self._cached = (stamp, data, manifest_etag(data))
        return self._cached[1], self._cached[2]

    def notify(self) -> None:
        """Wake every long-poll: the manifest was just replaced."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait_change(
        self, after: str, timeout: float, over: asyncio.Event | None = None
    ) -> tuple[bytes, str] | None:
        """Return the manifest once its ETag differs from `after`, or None at timeout or
        once `over` is set (the long-poll must give its connection up).

        Wakes on `notify()` at once, and re-reads the file every `disk_check_s` for
        writers that bypass the server.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = self._event
            manifest = self.current()
            if manifest is not None and manifest[1] != after:
                return manifest
            remaining = deadline - loop.time()
            if remaining <= 0 or (over is not None and over.is_set()):
                return None
            await _either(event, over, min(remaining, self.disk_check_s))


async def _either(a: asyncio.Event, b: asyncio.Event | None, timeout: float) -> None:
    """Wait until `a` or `b` (None: `a` alone) is set, or `timeout` seconds."""
    waits = [asyncio.ensure_future(e.wait()) for e in (a, b) if e is not None]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
