"""The sampler side: follow a store's versions in the background, patch on `apply`."""

from __future__ import annotations

import logging
import threading
import time

import torch

from weight_teleport.codec import StagedPatch
from weight_teleport.observe.heartbeat import heartbeat_for
from weight_teleport.observe.subscriber import SubscriberMetrics, Where
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.errors import SubscriberFailed
from weight_teleport.pipeline.follow import Follower
from weight_teleport.pipeline.health import Health
from weight_teleport.pipeline.manifest import Entry
from weight_teleport.pipeline.metrics import UpdateReport, SubscriberStats
from weight_teleport.pipeline.stager import Stager
from weight_teleport.store import Store, open_store
from weight_teleport.targets.base import Target

log = logging.getLogger(__name__)

MAX_EVENTS = 100
"""Distinct events kept between two `apply` calls (the oldest are dropped)."""


class Subscriber:
    """Keeps `target` up to date with the store at `url`.

    A background thread watches the manifest, fetches each object, checks it (size,
    SHA-256, header) and stages it (decoded and digest-checked, nothing written). The
    sampler calls `apply()` when `ready()`: that is the only pause. Rejected objects are
    fetched again, with backoff, then set aside for another plan; weights that are not the
    next delta's base resync from the newest anchor. `health` tells how it goes; after
    `SubscriberConfig.give_up_after_s` without progress, `wait` and `apply` raise
    SubscriberFailed."""

    def __init__(self, url: str, target: Target, config: SubscriberConfig | None = None, *,
                 store: Store | None = None):
        self.config = config = config or SubscriberConfig()
        self.target = target
        self._own_store = store is None
        self._store = store or open_store(url, config.store)
        view = target.checkpoint_view()
        initial = config.initial_version
        if view is None and initial is not None:
            log.warning("SubscriberConfig.initial_version=%d is ignored: the target lends no "
                        "checkpoint view to decode against, so it starts from an anchor", initial)
            initial = None
        self.stats = SubscriberStats()
        self._stager = Stager(view, config.threads, config.device_staged_bytes, config.decompress_backend)
        self._pending: list[tuple[Entry, StagedPatch]] = []
        self._events: list[str] = []
        self._resynced = self._applying = self._closed = False
        self._failed: SubscriberFailed | None = None
        self._live_version = initial
        self._cond = threading.Condition()
        self._applied: StagedPatch | None = None
        """The last patch applied to the view, until its digests are checked."""
        self._follower = Follower(self, initial)
        self.metrics = SubscriberMetrics(config.metrics, self._where)
        """Prometheus metrics (`metrics.registry`; `SubscriberConfig.metrics`)."""
        self._heartbeat = heartbeat_for(url, config, self.metrics.position)
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name="weight-teleport-subscriber")
        self._thread.start()

    def _follow(self) -> None:
        try:
            self._stager.warm_up()
        except Exception:  # a cold kernel costs the first pause time, nothing else
            log.exception("warming up the CUDA kernels failed; the first update compiles them")
        self._follower.run()

    @property
    def version(self) -> int | None:
        """The version the target holds (None before the first apply)."""
        return self._live_version

    def _where(self) -> Where:
        """What the metrics and the heartbeat read (from any thread)."""
        f = self._follower
        latest = f.manifest.latest if f.manifest is not None else None
        return Where(self._live_version, latest, f.published_after(self._live_version), f.monitor.health)

    @property
    def health(self) -> Health:
        """The state of the follower: "starting", "healthy", "degraded" or "failing", the
        last error and since when (`Health`)."""
        return self._follower.monitor.health

    def ready(self) -> bool:
        """True when a staged version waits for `apply`."""
        with self._cond:
            return bool(self._pending)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a staged version waits for `apply`; False on timeout. Raises
        SubscriberFailed once the subscriber gave up and nothing staged is left."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._closed or self._failed, timeout)
            if not self._pending and self._failed is not None:
                raise self._failed
            return bool(self._pending)

    def apply(self) -> UpdateReport:
        """Write every staged version into the target (the pause) and report it.
        Returns an empty report when nothing is staged; raises SubscriberFailed once the
        subscriber gave up and nothing staged is left."""
        with self._cond:
            if not self._pending and self._failed is not None:
                raise self._failed
            pending, self._pending = self._pending, []
            report = UpdateReport(resynced=self._resynced, events=self._events)
            self._events, self._resynced, self._applying = [], False, bool(pending)
        t0 = time.perf_counter()
        for _, staged in pending:
            self.target.apply(staged)
        if pending and self._stager.on_cuda:  # the patch is in place for every stream
            torch.cuda.current_stream(self._stager.device).synchronize()
        report.pause_s = time.perf_counter() - t0
        self.metrics.paused(len(pending), report.pause_s)
        report.versions = [e.version for e, _ in pending]
        report.bytes_fetched = sum(e.size for e, _ in pending)
        with self._cond:
            if pending:
                self._live_version = pending[-1][0].version
                self.stats.pause_s += report.pause_s
            if pending and self._stager.uses_view:
                self._applied = pending[-1][1]
            report.version = self._live_version
            self._applying = False
            self._cond.notify_all()
        if pending and self._heartbeat is not None:
            self._heartbeat.nudge()
        return report

    def _verify_applied(self) -> None:
        """After the pause, on the follower's thread: the live weights must carry the last
        applied patch's digests, else the next step resyncs."""
        with self._cond:
            staged, self._applied = self._applied, None
        if staged is None:
            return
        bad = self._stager.verify(staged)
        if bad:
            self._follower.request_resync(f"after applying version {staged.version}, tensor "
                                          f"{bad[0]!r} ({len(bad)} in all) lacks its digest")

    # Used by the Follower thread.
    def _event(self, message: str, resync: bool = False) -> None:
        """Note `message` for the next UpdateReport (each once, at most MAX_EVENTS); the
        health monitor logs failures, once each."""
        log.log(logging.INFO if resync else logging.DEBUG, "%s", message)
        with self._cond:
            if message not in self._events:
                if len(self._events) >= MAX_EVENTS:
                    del self._events[0]
                self._events.append(message)
            self._resynced = self._resynced or resync

    def _sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if the subscriber closes."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed, seconds)

    def _give_up(self, error: SubscriberFailed) -> None:
        with self._cond:
            self._failed = error
            self._cond.notify_all()

    def _wait_for_room(self) -> bool:
        """Block until another version may be staged; False once closed."""
        def room() -> bool:
            if self._closed:
                return True
            if self._stager.uses_view:
                return not self._pending and not self._applying
            staged = sum(s.nbytes for _, s in self._pending)
            return not self._pending or staged < self.config.max_staged_bytes
        with self._cond:
            self._cond.wait_for(room)
            return not self._closed

    def _push(self, entry: Entry, staged: StagedPatch) -> None:
        with self._cond:
            if entry.kind == "snapshot":
                self._pending.clear()  # it overwrites whatever older patches would write
            self._pending.append((entry, staged))
            self._cond.notify_all()

    def close(self) -> None:
        """Stop following (staged versions are dropped) and close the store."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._own_store:
            self._store.close()
        self.metrics.close()
        if self._heartbeat is not None:
            self._heartbeat.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
