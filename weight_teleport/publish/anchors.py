"""Anchors off the critical path: a version's snapshot is uploaded and announced by a thread
of its own, after the version's delta was announced, so that neither that delta nor the
next versions wait for the anchor's bytes to reach the store; and while a delta uploads,
the anchor's upload pauses between its pieces (`DeltasFirst`), so that the delta does not
share the link and the store's server with it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from weight_teleport import threads
from weight_teleport.observe.logs import kv
from weight_teleport.pipeline.errors import PublishCancelled
from weight_teleport.format.manifest import Entry
from weight_teleport.pipeline.metrics import PublishResult
from weight_teleport.store import Store

log = logging.getLogger(__name__)


class DeltasFirst:
    """Uploads of deltas go before the anchor's: `uploading()` brackets a delta's upload and
    announcement; `wait_turn()`, called by the anchor's upload between its pieces, blocks
    while one is in flight, at most `max_wait_s` at a time (below a server's limit on a
    stalled body: 30 s for the origin)."""

    def __init__(self, max_wait_s: float = 5.0):
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._deltas = 0

    @contextmanager
    def uploading(self) -> Iterator[None]:
        with self._cond:
            self._deltas += 1
        try:
            yield
        finally:
            with self._cond:
                self._deltas -= 1
                self._cond.notify_all()

    def wait_turn(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._deltas == 0, self.max_wait_s)


class AnchorUploader:
    """One anchor in flight at a time: `submit` hands it over, or returns False while the
    previous one is still uploading (the caller postpones the anchor to a later version;
    memory stays at one encoded anchor). A second uploader, `what="catchup"`, carries the
    catch-up deltas the same way."""

    def __init__(
        self,
        store: Store,
        announce: Callable[[Entry], None],
        deltas_first: DeltasFirst | None = None,
        what: str = "anchor",
    ):
        self._store, self._announce = store, announce
        self.what = what
        """"anchor" or "catchup": the objects carried, as logs and `PublishResult` name them."""
        self.deltas_first = deltas_first or DeltasFirst()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.failures: list[tuple[int, Exception]] = []
        """(version, error) of every object that could not be stored or announced."""

    def submit(self, entry: Entry, pack, result: PublishResult) -> bool:
        """Upload `pack` under `entry` and announce it in the background; its timings go
        into `result` (`anchor_s` or `catchup_s`) and the entry into `result.objects` once
        announced."""
        with self._cond:
            if self._busy:
                return False
            self._busy = True
        self._thread = threads.start(
            lambda: self._upload(entry, pack, result), f"weight-teleport-{self.what}", self._stopping.set
        )
        return True

    def _between_pieces(self) -> None:
        if self._stopping.is_set():
            raise PublishCancelled("the interpreter exits: the anchor's upload was stopped")
        self.deltas_first.wait_turn()

    def _upload(self, entry: Entry, pack, result: PublishResult) -> None:
        t0 = time.perf_counter()
        try:
            self._store.put(entry.key, pack, content_hash=entry.sha256, between_pieces=self._between_pieces)
            self._announce(entry)
            result.objects.append(entry)
            setattr(result, f"{self.what}_s", time.perf_counter() - t0)
        except Exception as exc:  # the next version gets one instead
            log.error(
                "%s",
                kv(
                    f"{self.what}_failed",
                    version=entry.version,
                    error=f"{type(exc).__name__}: {exc}",
                    next="the next version gets one",
                ),
            )
            self.failures.append((entry.version, exc))
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no anchor is in flight; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy, timeout)
