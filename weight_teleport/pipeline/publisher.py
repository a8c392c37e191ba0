"""The trainer side: snapshot the weights, encode and upload them in the background."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.pipeline.encode import EncodeJob, Encoder
from weight_teleport.pipeline.metrics import PublishResult
from weight_teleport.pipeline.snapshots import SnapshotPool, check_config
from weight_teleport.store import Store, open_store

log = logging.getLogger(__name__)


@dataclass
class PublishHandle:
    """The progress of one `publish`: wait for it, or poll `done()`."""

    version: int
    future: Future = field(default_factory=Future, repr=False)

    def done(self) -> bool:
        """True once the version is published, skipped, or failed."""
        return self.future.done()

    def wait(self, timeout: float | None = None) -> PublishResult:
        """The PublishResult once the manifest names this version; re-raise its error."""
        return self.future.result(timeout)


@dataclass
class _Queued:
    handle: PublishHandle
    job: EncodeJob


class Publisher:
    """Publishes weight versions to the store at `url`: `publish` snapshots and returns,
    a worker thread encodes (a delta against the baseline, a snapshot at anchors),
    uploads, updates the manifest and applies retention. One publisher per store."""

    def __init__(self, url: str, config: PublisherConfig | None = None, *,
                 store: Store | None = None):
        self.config = config = config or PublisherConfig()
        check_config(config)
        self._own_store = store is None
        self._store = store or open_store(url, config.store)
        self._encoder = Encoder(self._store, config)
        self._pool = SnapshotPool(config.memory_budget_bytes, config.max_pending + 2,
                                  config.baseline_device)
        self._next_version = self._encoder.next_version()
        self._queue: deque[_Queued] = deque()
        self._cond = threading.Condition()
        self._busy = self._closed = False
        self.results: list[PublishResult] = []
        """Every finished PublishResult, in order (metrics)."""
        self._worker = threading.Thread(target=self._work, daemon=True,
                                        name="weight-teleport-publisher")
        self._worker.start()

    def publish(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> PublishHandle:
        """Snapshot `state` (name -> tensor, checkpoint layout) as `version` (default: the
        next one) and return at once; the rest runs in the background."""
        t0 = time.perf_counter()
        with self._cond:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            version = self._next_version if version is None else int(version)
            if version < self._next_version:
                raise ValueError(f"version {version} is not after the last one published or "
                                 f"queued ({self._next_version - 1}); versions only grow")
            self._make_room()
            self._next_version = version + 1
        snapshot = self._pool.take(state)
        job = EncodeJob(version, snapshot, PublishResult(version, snapshot_s=time.perf_counter() - t0),
                        t0)
        queued = _Queued(PublishHandle(version), job)
        with self._cond:
            self._queue.append(queued)
            self._cond.notify_all()
        return queued.handle

    def _make_room(self) -> None:
        """Apply back-pressure until the queue has a free slot (holding the lock)."""
        while len(self._queue) >= self.config.max_pending:
            if self.config.backpressure == "block":
                self._cond.wait()
                continue
            dropped = self._queue.popleft()
            self._pool.give(dropped.job.snapshot)
            dropped.job.result.skipped = True
            dropped.handle.future.set_result(dropped.job.result)
            log.info("version %d skipped: the encoder is busy (backpressure='skip')",
                     dropped.handle.version)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                item = self._queue.popleft()
                self._busy = True
                self._cond.notify_all()
            try:
                result = self._encoder.run(item.job)
                self._pool.give(self._encoder.swap_baseline(item.job.snapshot))
                self.results.append(result)
                item.handle.future.set_result(result)
            except Exception as exc:  # reported through the handle; the baseline is kept
                log.error("publishing version %d failed: %s", item.handle.version, exc)
                self._pool.give(item.job.snapshot)
                item.handle.future.set_exception(exc)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued version is published and its anchor stored; False on
        timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not self._cond.wait_for(lambda: not self._queue and not self._busy, timeout):
                return False
        return self._encoder.anchors.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Publish what is queued, stop the worker and close the store."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join()
        self._encoder.close()
        if self._own_store:
            self._store.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
