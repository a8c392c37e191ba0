"""The objects a subscriber fetches: each one's failures, the ones set aside, one fetched ahead.

Contracts: an object's failures are counted until it is staged, across fetches; at
`fetch_attempts` it is set aside (plans avoid it while another plan exists). An object
whose checked bytes failed to stage is broken for good: its bytes will not change, so no
plan takes it again. At most one object is fetched ahead, on a thread of its own."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from weight_teleport.observe.subscriber import SubscriberMetrics
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.fetch import Fetched, fetch_pack, fetch_parts
from weight_teleport.pipeline.handoff import Handoff
from weight_teleport.pipeline.health import HealthMonitor
from weight_teleport.pipeline.manifest import Entry
from weight_teleport.pipeline.metrics import SubscriberStats
from weight_teleport.store import InvalidKey, NotFound, Store, TooLarge

OBJECT_ERRORS = (NotFound, InvalidKey, TooLarge, ObjectRejected)
"""Fetch failures of one object (other store errors are the store's, not the object's)."""


class Objects:
    """Fetches the plan's objects from `store` (into pinned memory when `pinned`: for CUDA
    weights) and keeps their failures; reports them to `handoff` and `monitor`, counts in `stats` and
    `metrics`."""

    def __init__(self, config: SubscriberConfig, store: Store, pinned: bool, handoff: Handoff,
                 monitor: HealthMonitor, stats: SubscriberStats, metrics: SubscriberMetrics):
        self.config, self.store, self.pinned = config, store, pinned
        self.handoff, self.monitor, self.stats, self.metrics = handoff, monitor, stats, metrics
        self.strikes: dict[str, int] = {}
        """Failures of each key since it was last staged."""
        self.broken: dict[str, str] = {}
        """Keys that can never be staged here, and why."""
        self.prefetcher = ThreadPoolExecutor(1, thread_name_prefix="wt-prefetch")
        self.ahead: tuple[Entry, Future] | None = None
        """The next object of the plan, being fetched while the current one stages."""

    def close(self) -> None:
        """Drop the object fetched ahead and stop the prefetch thread."""
        self.ahead = None
        self.prefetcher.shutdown(wait=True, cancel_futures=True)

    # What plans avoid.
    def set_aside(self) -> set[str]:
        """Keys that failed `fetch_attempts` times since they were last staged."""
        return {k for k, n in self.strikes.items() if n >= self.config.fetch_attempts}

    def note(self) -> str:
        """What is set aside and why, for a message that no plan exists ("" if nothing)."""
        notes = [f"{k} ({why})" for k, why in self.broken.items()]
        notes += [f"{k} (failed {n} times)" for k, n in self.strikes.items()
                  if n >= self.config.fetch_attempts and k not in self.broken]
        return f"; set aside: {'; '.join(notes[:3])}" if notes else ""

    def keep_listed(self, listed: set[str]) -> None:
        """Forget the keys a newly accepted manifest no longer lists."""
        self.strikes = {k: n for k, n in self.strikes.items() if k in listed}
        self.broken = {k: why for k, why in self.broken.items() if k in listed}

    def forget(self) -> None:
        """Forget every failure (the store was reset)."""
        self.strikes, self.broken = {}, {}

    # Fetching.
    def prefetch(self, entry: Entry) -> None:
        """Start fetching `entry` on the prefetch thread (one object ahead at most)."""
        if self.ahead is None or self.ahead[0] != entry:
            self.ahead = (entry, self.prefetcher.submit(self._timed_fetch, entry))

    def _timed_fetch(self, entry: Entry) -> tuple[Fetched | list[Fetched], float]:
        t0 = time.perf_counter()
        pack = fetch_parts(self.store, entry, self.pinned) if entry.parts \
            else fetch_pack(self.store, entry, pinned=self.pinned)
        return pack, time.perf_counter() - t0

    def fetch(self, entry: Entry) -> Fetched | list[Fetched] | None:
        """The checked object with its header (its bytes in pinned memory for CUDA weights; a
        list for an entry made of parts, each checked against its part and all against each
        other), or None after a failure; taken from the prefetch thread where it fetched
        `entry` (another prefetched object is dropped: the plan changed)."""
        ahead, self.ahead = self.ahead, None
        try:
            if ahead is not None and ahead[0] == entry:
                pack, seconds = ahead[1].result()
            else:
                pack, seconds = self._timed_fetch(entry)
        except OBJECT_ERRORS as exc:
            if isinstance(exc, ObjectRejected):
                self.stats.objects_rejected += 1
                self.metrics.rejected.inc()
                self.strike(entry, f"rejected {exc}")
            else:
                self.strike(entry, f"cannot fetch {entry.key}: {exc}")
            return None
        self.stats.fetch_s += seconds
        nbytes = sum(len(p.data) for p in pack) if isinstance(pack, list) else len(pack.data)
        self.metrics.fetched_one(nbytes, seconds)
        self.stats.bytes_fetched += nbytes
        self.stats.objects_fetched += 1
        return pack

    # Outcomes.
    def strike(self, entry: Entry, why: str, staging: bool = False) -> None:
        """Count a failure of `entry`; set it aside at `fetch_attempts` (for good if it was
        fetched and checked, yet failed to stage: its bytes will not change)."""
        n = self.strikes[entry.key] = self.strikes.get(entry.key, 0) + 1
        if n >= self.config.fetch_attempts:
            if staging:
                self.broken[entry.key] = why
            why += f" ({n} failures: set aside, seeking another plan)"
        self.handoff.event(why)
        self.monitor.failure(why)

    def set_broken(self, entry: Entry, why: str) -> None:
        """Set `entry` aside for good: no plan takes it again."""
        self.broken[entry.key] = why
        self.handoff.event(why)
        self.monitor.failure(why, permanent=True)

    def staged(self, entry: Entry) -> None:
        """`entry` was staged: its failures are forgiven."""
        self.strikes.pop(entry.key, None)
