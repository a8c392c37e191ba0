"""The trainer side: snapshot the weights, encode and upload them in the background."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as WaitTimeout
from dataclasses import dataclass, field

import torch

from weight_teleport import threads
from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.publish.encode import EncodeJob, Encoder
from weight_teleport.errors import WeightTeleportError
from weight_teleport.observe.logs import kv
from weight_teleport.observe.publisher import PublisherMetrics
from weight_teleport.pipeline.errors import PublishCancelled, PublishConflict, PublishFailed
from weight_teleport.format.manifest import from_json
from weight_teleport.pipeline.metrics import PublishResult
from weight_teleport.publish.snapshots import SnapshotPool, check_config
from weight_teleport.publish.writes import TrackedWrites, describe_cancel
from weight_teleport.quantize import sampler_format
from weight_teleport.store import ManifestChanged, Store, StoreError, open_store

log = logging.getLogger(__name__)


@dataclass
class PublishHandle:
    """The progress of one `publish`: wait for it, or poll `done()`."""

    version: int
    future: Future = field(default_factory=Future, repr=False)
    reported: bool = field(default=False, repr=False)
    """Whether `wait` raised this version's error (then `flush` does not again)."""

    def done(self) -> bool:
        """True once the version is published, skipped, or failed."""
        return self.future.done()

    def wait(self, timeout: float | None = None) -> PublishResult:
        """The PublishResult once the manifest names this version; re-raise its error."""
        try:
            return self.future.result(timeout)
        except Exception as exc:
            self.reported = not isinstance(exc, WaitTimeout)
            raise


@dataclass
class _Queued:
    handle: PublishHandle
    job: EncodeJob


class Publisher:
    """Publishes weight versions to the store at `url`: `publish` snapshots and returns,
    a worker thread encodes (a delta against the baseline, a snapshot at anchors),
    uploads, updates the manifest and applies retention. One publisher per store: a
    second one makes the later writer fail with PublishConflict.

    Use it as a context manager (`with Publisher(...) as pub:`), or call `close()`:
    it publishes what is queued, and raises PublishFailed for versions that failed.
    Ctrl-C inside the `with` block cancels instead (`cancel()`).
    """

    def __init__(self, url: str, config: PublisherConfig | None = None, *, store: Store | None = None):
        """Open the store and check now that it takes writes (a wrong token, a read-only
        directory), before anything is encoded: raises the store's AuthError."""
        self.config = config = config or PublisherConfig()
        sign = check_config(config)
        self.url = url
        self._own_store, self._store_closed = store is None, False
        self._store = store or open_store(url, config.store)
        try:
            try:
                self._store.check_write_access()
            except StoreError as exc:
                raise type(exc)(f"the publisher cannot write to {url}: {exc}") from None
            self._writes = TrackedWrites(self._store, config.retry_for_s)
            self._encoder = Encoder(self._writes, config, sign)  # type: ignore[arg-type]
        except BaseException:
            self._close_store()
            raise
        self._format = sampler_format(config.sampler_format)
        copies = config.max_pending + 2 + (1 if config.catchup_every else 0)  # + the boot version's
        self._pool = SnapshotPool(config.memory_budget_bytes, copies, config.baseline_device, self._format)
        self._next_version = self._encoder.next_version()
        self._queue: deque[_Queued] = deque()
        self._cond = threading.Condition()
        self._current: _Queued | None = None
        self._closed = self._cancelled = False
        self._conflict: PublishConflict | None = None
        self._failed: list[_Queued] = []
        self.metrics = PublisherMetrics(config.metrics, lambda: len(self._queue))
        """Prometheus metrics (`metrics.registry`; `PublisherConfig.metrics`)."""
        self._encoder.on_announce = self.metrics.announced
        self.results: list[PublishResult] = []
        """Every finished PublishResult, in order (metrics)."""
        self._worker = threads.start(self._work, "weight-teleport-publisher", self._stop_at_exit)

    def publish(
        self, state: Mapping[str, torch.Tensor], version: int | None = None, *, files: Mapping[str, bytes] | None = None
    ) -> PublishHandle:
        """Snapshot `state` (name -> tensor, checkpoint layout) as `version` (default: the
        next one) and return at once; the rest runs in the background. `files`: the
        checkpoint's small side files by name (config.json, tokenizer files), stored with
        every anchor from this version on, until other files are given."""
        t0 = time.perf_counter()
        with self._cond:
            if self._conflict is not None:
                raise self._conflict
            if self._closed:
                raise RuntimeError("the publisher is closed")
            version = self._next_version if version is None else int(version)
            if version < self._next_version:
                raise ValueError(
                    f"version {version} is not after the last one published or "
                    f"queued ({self._next_version - 1}); versions only grow"
                )
            self._make_room()
            self._next_version = version + 1
        try:
            snapshot = self._pool.take(state)
        except BaseException:
            with self._cond:  # nothing of this version was queued: it can be published again
                if self._next_version == version + 1:
                    self._next_version = version
            raise
        job = EncodeJob(
            version,
            snapshot,
            PublishResult(version, snapshot_s=time.perf_counter() - t0),
            t0,
            None if files is None else self._files(files),
        )
        queued = _Queued(PublishHandle(version), job)
        with self._cond:
            self._queue.append(queued)
            self._cond.notify_all()
        return queued.handle

    def _files(self, files: Mapping[str, bytes]) -> dict[str, bytes]:
        """The side files stored with anchors: `files`, with the sampler format's
        `quantization_config` in config.json."""
        out = dict(files)
        if self._format is not None and "config.json" in out:
            out["config.json"] = self._format.hf_config(out["config.json"])
        return out

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
            self.metrics.skipped.inc()
            log.info(
                "%s",
                kv("version_skipped", version=dropped.handle.version, why="the encoder is busy (backpressure='skip')"),
            )

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                item = self._current = self._queue.popleft()
                self._writes.begin()  # with `_current`: what `cancel` reads of both agrees
                self._cond.notify_all()
            self._run(item)
            with self._cond:
                self._current = None
                self._cond.notify_all()

    def _run(self, item: _Queued) -> None:
        """Publish one queued version; its handle gets the result or the error."""
        try:
            if self._conflict is not None:
                raise self._conflict
            result = self._encoder.run(item.job)
            self._pool.give(self._encoder.swap_baseline(item.job.snapshot))
            self.results.append(result)
            self.metrics.published(result)
            item.handle.future.set_result(result)
            return
        except ManifestChanged as exc:
            error: Exception = self._lost_the_store(item.handle.version, exc)
        except Exception as exc:  # reported through the handle and flush; the baseline is kept
            if isinstance(exc, PublishCancelled) or self._cancelled:  # any error once cancelled
                error = PublishCancelled(
                    f"version {item.handle.version} was not published: the publisher was cancelled"
                )
                error.__cause__ = exc
            else:
                log.error("%s", kv("publish_failed", version=item.handle.version, error=f"{type(exc).__name__}: {exc}"))
                error = exc
        self._pool.give(item.job.snapshot)
        item.handle.future.set_exception(error)
        if not isinstance(error, PublishCancelled):
            self.metrics.failures.inc()
            with self._cond:
                self._failed.append(item)

    def _lost_the_store(self, version: int, exc: ManifestChanged) -> PublishConflict:
        """The error of the version that found another publisher's manifest; every later
        version fails with it too."""
        orphans = self._orphans(self._writes.unannounced())
        left = f" Uploaded for it and named by no manifest (safe to delete): {', '.join(orphans)}." if orphans else ""
        self._conflict = PublishConflict(
            f"version {version} was not published: another publisher updated the manifest "
            f"of {self.url} since this one read it ({exc}). Two publishers on one store "
            f"would orphan each other's versions: run one publisher per store, or give each "
            f"its own URL; this one publishes nothing more.{left}"
        )
        log.error("%s", self._conflict)
        return self._conflict

    def _orphans(self, uploaded: list[str]) -> list[str]:
        """The keys of `uploaded` that the store's manifest does not name (the other
        publisher may have written the same bytes under the same key)."""
        try:
            raw = self._store.get_manifest()
            named = {k for e in from_json(raw).entries for k in e.keys} if raw is not None else set()
        except WeightTeleportError as exc:  # the conflict is the error to report
            log.warning("could not tell which uploads are unused: %s", exc)
            return []
        return [key for key in uploaded if key not in named]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued version is published and its anchor and catch-up delta
        stored; False on timeout.

        Raises PublishFailed naming the versions that failed since the last flush (those
        whose error `PublishHandle.wait` raised already excepted). An anchor that could
        not be stored is not a failed version (the next version gets one): it is logged.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            done = self._cond.wait_for(lambda: not self._queue and self._current is None, timeout)
        if done:
            done = self._encoder.wait_uploads(deadline)
        self._raise_failures()
        return done

    def _raise_failures(self) -> None:
        with self._cond:
            failed, self._failed = self._failed, []
        failures: list[tuple[int, BaseException]] = []
        for q in failed:
            if not q.handle.reported:
                exc = q.handle.future.exception()
                assert exc is not None  # a failed version's future holds its error
                failures.append((q.handle.version, exc))
        if failures:
            raise PublishFailed(failures) from failures[0][1]

    def cancel(self) -> str:
        """Stop now: drop the queued versions, refuse the version in hand's further
        writes (waiting for one in flight), and return what was left, in words. The
        handles of the versions not published raise PublishCancelled."""
        with self._cond:
            self._closed = self._cancelled = True
            dropped, current = list(self._queue), self._current
            published = self.results[-1].version if self.results else None
            self._queue.clear()
            self._cond.notify_all()
        uploaded, announced, stray = self._writes.cancel()
        for item in dropped:
            self._pool.give(item.job.snapshot)
            item.handle.future.set_exception(
                PublishCancelled(
                    f"version {item.handle.version} was not published: the publisher was "
                    f"cancelled before it was encoded"
                )
            )
        return describe_cancel(
            [q.handle.version for q in dropped],
            current.handle.version if current else None,
            uploaded,
            announced,
            stray,
            published,
        )

    def _stop_at_exit(self) -> None:
        """The interpreter exits with the worker running: it writes nothing more, and a
        version left unpublished is logged."""
        with self._cond:
            if self._cancelled or (not self._queue and self._current is None):
                self._closed = True  # an idle worker returns
                self._cond.notify_all()
                return
        log.warning("%s", kv("publisher_stopped_at_exit", url=self.url, left=self.cancel()))

    def close(self) -> None:
        """Publish what is queued (unless cancelled), stop the worker and close the
        store; then raise PublishFailed if versions failed (see `flush`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if not self._cancelled:  # a cancelled worker writes nothing more: not awaited
            self._worker.join()
            self._encoder.close()  # the anchor and catch-up delta in flight
        self._close_store()
        self._raise_failures()

    def _close_store(self) -> None:
        if self._store_closed:  # close() again
            return
        self._store_closed = True
        if self._own_store:
            self._store.close()
        if hasattr(self, "metrics"):
            self.metrics.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):  # Ctrl-C, exit
            log.warning("publisher interrupted: %s", self.cancel())
        if exc_type is None:
            self.close()
            return
        try:  # the exception in flight is the one to see
            self.close()
        except PublishFailed as failed:
            log.error("%s", failed)
