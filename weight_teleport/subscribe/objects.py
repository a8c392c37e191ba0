"""The objects a subscriber fetches: checked, timed and counted, one fetched ahead.

Contracts: a failed fetch is a strike against its object in the follower's `Failures`
(pipeline/failures.py), which sets it aside after `fetch_attempts`. At most one object is
fetched ahead, on a thread of its own."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from weight_teleport.observe.subscriber import SubscriberMetrics
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.subscribe.failures import Failures
from weight_teleport.pipeline.fetch import Fetched, fetch_pack, fetch_parts
from weight_teleport.format.manifest import Entry
from weight_teleport.pipeline.metrics import SubscriberStats
from weight_teleport.store import InvalidKey, NotFound, Store, TooLarge

OBJECT_ERRORS = (NotFound, InvalidKey, TooLarge, ObjectRejected)
"""Fetch failures of one object (other store errors are the store's, not the object's)."""


class Objects:
    """Fetches the plan's objects from `store` (into pinned memory when `pinned`: for CUDA
    weights); counts their failures in `failures`, the rest in `stats` and `metrics`."""

    def __init__(
        self, store: Store, pinned: bool, failures: Failures, stats: SubscriberStats, metrics: SubscriberMetrics
    ):
        self.store, self.pinned, self.failures = store, pinned, failures
        self.stats, self.metrics = stats, metrics
        self.prefetcher = ThreadPoolExecutor(1, thread_name_prefix="wt-prefetch")
        self.ahead: tuple[Entry, Future] | None = None
        """The next object of the plan, being fetched while the current one stages."""

    def close(self) -> None:
        """Drop the object fetched ahead and stop the prefetch thread."""
        self.ahead = None
        self.prefetcher.shutdown(wait=True, cancel_futures=True)

    def prefetch(self, entry: Entry) -> None:
        """Start fetching `entry` on the prefetch thread (one object ahead at most)."""
        if self.ahead is None or self.ahead[0] != entry:
            self.ahead = (entry, self.prefetcher.submit(self._timed_fetch, entry))

    def _timed_fetch(self, entry: Entry) -> tuple[Fetched | list[Fetched], float]:
        t0 = time.perf_counter()
        pack = (
            fetch_parts(self.store, entry, self.pinned)
            if entry.parts
            else fetch_pack(self.store, entry, pinned=self.pinned)
        )
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
                self.failures.strike(entry, f"rejected {exc}")
            else:
                self.failures.strike(entry, f"cannot fetch {entry.key}: {exc}")
            return None
        self.stats.fetch_s += seconds
        nbytes = sum(len(p.data) for p in pack) if isinstance(pack, list) else len(pack.data)
        self.metrics.fetched_one(nbytes, seconds)
        self.stats.bytes_fetched += nbytes
        self.stats.objects_fetched += 1
        return pack
