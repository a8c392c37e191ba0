"""The sampler side: follow a store's versions in the background, patch on `apply`."""

from __future__ import annotations

import logging
import time

import torch

from weight_teleport import threads
from weight_teleport.observe.heartbeat import heartbeat_for
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.subscribe.handoff import Handoff
from weight_teleport.pipeline.health import Health
from weight_teleport.pipeline.metrics import UpdateReport, SubscriberStats
from weight_teleport.subscribe.stager import Stager
from weight_teleport.subscribe.subscriber_follow import SubscriberFollower
from weight_teleport.store import Store, open_store
from weight_teleport.subscribe.target import Target

log = logging.getLogger(__name__)


class Subscriber:
    """Keeps `target` up to date with the store at `url`.

    A background thread watches the manifest, fetches each object, checks it (size,
    SHA-256, header) and stages it (decoded and digest-checked, nothing written). The
    sampler calls `apply()` when `ready()`: that is the only pause. Rejected objects are
    fetched again, with backoff, then set aside for another plan; weights that are not the
    next delta's base resync from the newest anchor. `health` tells how it goes; after
    `SubscriberConfig.give_up_after_s` without progress, `wait` and `apply` raise
    SubscriberFailed."""

    def __init__(self, url: str, target: Target, config: SubscriberConfig | None = None, *, store: Store | None = None):
        self.config = config = config or SubscriberConfig()
        config.validate()
        self.target = target
        self._own_store = store is None
        self._store = store or open_store(url, config.store)
        view = target.checkpoint_view()
        initial = config.initial_version
        if view is None and initial is not None:
            log.warning(
                "SubscriberConfig.initial_version=%d is ignored: the target lends no "
                "checkpoint view to decode against, so it starts from an anchor",
                initial,
            )
            initial = None
        self.stats = SubscriberStats()
        self._stager = Stager(view, config.threads, config.device_staged_bytes, config.decompress_backend)
        self._handoff = Handoff(initial, self._stager.uses_view, config.max_staged_bytes)
        self._follower = SubscriberFollower(config, self._store, self._stager, self._handoff, self.stats, initial)
        self.metrics = self._follower.metrics
        """Prometheus metrics (`metrics.registry`; `SubscriberConfig.metrics`)."""
        self._heartbeat = heartbeat_for(url, config, self.metrics.position)
        self._thread = threads.start(self._follower.run, "weight-teleport-subscriber", self._handoff.close)

    @property
    def version(self) -> int | None:
        """The version the target holds (None before the first apply)."""
        return self._handoff.live_version

    @property
    def health(self) -> Health:
        """The state of the follower: "starting", "healthy", "degraded" or "failing", the
        last error and since when (`Health`)."""
        return self._follower.monitor.health

    def ready(self) -> bool:
        """True when a staged version waits for `apply`."""
        return self._handoff.ready()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a staged version waits for `apply`; False on timeout. Raises
        SubscriberFailed once the subscriber gave up and nothing staged is left."""
        return self._handoff.wait(timeout)

    def apply(self) -> UpdateReport:
        """Write every staged version into the target (the pause) and report it.
        Returns an empty report when nothing is staged; raises SubscriberFailed once the
        subscriber gave up and nothing staged is left."""
        pending, events, resynced = self._handoff.begin_apply()
        report = UpdateReport(resynced=resynced, events=events)
        t0 = time.perf_counter()
        for _, staged in pending:
            self.target.apply(staged)
        if pending and self._stager.on_cuda:  # the patch is in place for every stream
            torch.cuda.current_stream(self._stager.device).synchronize()
        report.pause_s = time.perf_counter() - t0
        self.metrics.paused(len(pending), report.pause_s)
        report.versions = [e.version for e, _ in pending]
        report.bytes_fetched = sum(e.size for e, _ in pending)
        if pending:
            self.stats.pause_s += report.pause_s
        report.version = self._handoff.end_apply(pending)
        if pending and self._heartbeat is not None:
            self._heartbeat.nudge()
        return report

    def close(self) -> None:
        """Stop following (staged versions are dropped) and close the store."""
        self._handoff.close()
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
