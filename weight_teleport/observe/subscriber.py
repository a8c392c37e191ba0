"""The subscriber's Prometheus metrics (`Subscriber.metrics`), and the figures its
heartbeat reports (`position`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, StateSetMetricFamily
from prometheus_client.registry import Collector

from weight_teleport.observe.config import MetricsConfig
from weight_teleport.observe.prom import NAMESPACE, SECONDS_BUCKETS, Exposed

STATES = ("starting", "healthy", "degraded", "failing")
PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_PREFIX = f"{NAMESPACE}_subscriber"


class HealthView(Protocol):
    """What the metrics read of the subscriber's `Health`."""

    @property
    def state(self) -> str: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def consecutive_failures(self) -> int: ...


@dataclass(frozen=True)
class Where:
    """The subscriber's state as its metrics read it, at scrape time."""

    version: int | None
    """The version the target serves (None before the first apply)."""
    latest: int | None
    """The newest version of the accepted manifest (None: none yet)."""
    latest_published_at: float | None
    """When the oldest version newer than `version` was published (Unix seconds; None if
    up to date or unknown)."""
    health: HealthView
    """The subscriber's `Health`."""


class SubscriberMetrics(Exposed):
    """Counters and timings of one subscriber; its follower and `apply` call the verbs.
    Gauges (version, lag, health, last error) are read from `where()` when scraped."""

    def __init__(self, config: MetricsConfig | None, where: Callable[[], Where]):
        super().__init__(config, "subscriber")
        self.where = where
        opts: dict[str, Any] = dict(namespace=NAMESPACE, subsystem="subscriber", registry=self.registry)
        seconds: dict[str, Any] = dict(buckets=SECONDS_BUCKETS, **opts)
        self.fetch = Histogram("fetch_seconds", "Time to fetch and check an object.", **seconds)
        self.stage = Histogram("stage_seconds", "Time to decode and verify an object (outside the pause).", **seconds)
        self.pause = Histogram("pause_seconds", "Time an apply wrote the live weights.", buckets=PAUSE_BUCKETS, **opts)
        self.ready = Histogram(
            "publish_to_ready_seconds", "From a version's publication to its patch staged here.", **seconds
        )
        self.fetched_bytes = Counter("fetched_bytes", "Object bytes fetched and accepted.", **opts)
        self.fetched = Counter("objects_fetched", "Objects fetched and accepted.", **opts)
        self.rejected = Counter(
            "objects_rejected", "Objects refused (size, SHA-256 or header not the manifest's).", **opts
        )
        self.resyncs = Counter("resyncs", "Restarts from an anchor.", **opts)
        self.retries = Counter("retries", "Failed steps retried after a backoff.", **opts)
        self.applied = Counter("versions_applied", "Versions written into the target.", **opts)
        self.resync_count = self.fetched_byte_count = 0
        self.last_pause_s: float | None = None
        self.last_ready_s: float | None = None
        """publish -> ready of the last version staged (None: unknown)."""
        self.registry.register(_Gauges(self))

    def fetched_one(self, nbytes: int, seconds: float) -> None:
        self.fetched_byte_count += nbytes
        self.fetched.inc()
        self.fetched_bytes.inc(nbytes)
        self.fetch.observe(seconds)

    def resynced(self) -> None:
        self.resync_count += 1
        self.resyncs.inc()

    def staged(self, seconds: float, published_at: float | None) -> None:
        """An object was staged; `published_at`: its version's publication (Unix s)."""
        self.stage.observe(seconds)
        if published_at:
            self.last_ready_s = max(0.0, time.time() - published_at)
            self.ready.observe(self.last_ready_s)

    def paused(self, versions: int, seconds: float) -> None:
        """An apply wrote `versions` versions in `seconds`."""
        if versions:
            self.applied.inc(versions)
            self.pause.observe(seconds)
            self.last_pause_s = seconds

    def position(self) -> dict:
        """The figures a heartbeat reports: version, state, lag, last pause and error."""
        w = self.where()
        return {
            "version": w.version,
            "latest": w.latest,
            "state": w.health.state,
            "last_error": w.health.last_error,
            "versions_behind": _behind(w),
            "lag_s": _lag_s(w),
            "pause_s": self.last_pause_s,
            "ready_s": self.last_ready_s,
            "resyncs": self.resync_count,
            "fetched_bytes": self.fetched_byte_count,
        }


def _behind(w: Where) -> int | None:
    if w.latest is None:
        return None
    return w.latest + 1 if w.version is None else max(0, w.latest - w.version)


def _lag_s(w: Where) -> float | None:
    """Seconds since the oldest version not served was published (0: up to date)."""
    if _behind(w) == 0:
        return 0.0
    return None if w.latest_published_at is None else max(0.0, time.time() - w.latest_published_at)


class _Gauges(Collector):
    """The gauges read from the subscriber's state when scraped."""

    def __init__(self, metrics: SubscriberMetrics):
        self._m = metrics

    def collect(self):
        w = self._m.where()
        nan = math.nan
        yield GaugeMetricFamily(
            f"{_PREFIX}_version",
            "The version the target serves (NaN before the first apply).",
            value=nan if w.version is None else w.version,
        )
        yield GaugeMetricFamily(
            f"{_PREFIX}_latest_version",
            "The store's newest version as last read.",
            value=nan if w.latest is None else w.latest,
        )
        behind = _behind(w)
        yield GaugeMetricFamily(
            f"{_PREFIX}_versions_behind",
            "Versions published after the one served.",
            value=nan if behind is None else behind,
        )
        yield GaugeMetricFamily(
            f"{_PREFIX}_lag_seconds",
            "Since the oldest version not yet served was published (0 when up to date).",
            value=_lag_s(w) if _lag_s(w) is not None else nan,
        )
        state = StateSetMetricFamily(f"{_PREFIX}_health", "The subscriber's health state.")
        state.add_metric([], {s: s == w.health.state for s in STATES})
        yield state
        info = InfoMetricFamily(f"{_PREFIX}_last_error", "The latest failure's message (empty: none yet).")
        info.add_metric([], {"message": (w.health.last_error or "")[:200]})
        yield info
        yield GaugeMetricFamily(
            f"{_PREFIX}_consecutive_failures", "Failures since the last progress.", value=w.health.consecutive_failures
        )
