"""The subscriber's follower: the follow loop (`pipeline/follow.py`) over whole objects.

Each step fetches the plan's first object whole and checked (`Objects`: one ahead, its
failures counted), stages it against the target's view or a shadow copy (`Stager`) and
hands the staged version to `apply` through `Handoff`. Its own recovery rules: weights
that are not a delta's base resync from an anchor, at most once per delta (a delta that
fails on the very weights it names as its base, or a snapshot that does not fit, is set
aside for good); after a pause the live weights must carry the applied patch's digests,
else it resyncs; it gives up the weights it holds for an anchor only once that anchor is
fetched."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.observe.subscriber import SubscriberMetrics, Where
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.health import SubscriberFailed
from weight_teleport.subscribe.follow import FollowLoop
from weight_teleport.subscribe.handoff import Handoff
from weight_teleport.format.manifest import Entry
from weight_teleport.pipeline.metrics import SubscriberStats
from weight_teleport.subscribe.objects import Objects
from weight_teleport.pipeline.plan import Plan
from weight_teleport.subscribe.stager import Stager
from weight_teleport.pipeline.verify import patch_records, record_key
from weight_teleport.store import Store

if TYPE_CHECKING:
    from weight_teleport.codec import StagedParts, StagedPatch

log = logging.getLogger(__name__)

STAGE_ERRORS = (PackFormatError, PackMismatchError, DigestMismatchError)
"""What staging raises for a pack that does not fit the weights or is malformed."""


class SubscriberFollower(FollowLoop):
    """The subscriber's background loop. It reads `store` (its objects through `objects`),
    stages with `stager`, hands staged versions to `apply` through `handoff`, and counts in
    `stats` and its `metrics`; `head`: the version the target holds when it starts."""

    def __init__(
        self,
        config: SubscriberConfig,
        store: Store,
        stager: Stager,
        handoff: Handoff,
        stats: SubscriberStats,
        head: int | None,
    ):
        self.stager, self.handoff, self.stats = stager, handoff, stats
        self.head = head
        self.head_entry: Entry | None = None
        self.head_digests: dict | None = None
        """The digests `head_entry` promised for each record (by `verify.record_key`)."""
        super().__init__(config, store, floor=head, set_aside_after=config.fetch_attempts, who="subscriber")
        self.metrics = SubscriberMetrics(config.metrics, self.where)
        """The subscriber's Prometheus metrics (`SubscriberConfig.metrics`): its gauges read
        `where()`."""
        self.objects = Objects(store, stager.on_cuda, self.failures, stats, self.metrics)
        """The plan's objects: fetched (one ahead), their failures counted."""

    def where(self) -> Where:
        """What the metrics and the heartbeat read (from any thread)."""
        live = self.handoff.live_version
        latest = self.manifest.latest if self.manifest is not None else None
        return Where(live, latest, self.published_after(live), self.monitor.health)

    def published_after(self, version: int | None) -> float | None:
        """When the oldest version after `version` was published (Unix seconds; None if
        there is none, or the manifest does not say)."""
        if self.manifest is None:
            return None
        newer = [e for e in self.manifest.entries if version is None or e.version > version]
        return _published_s(newer[0]) if newer else None

    def run(self) -> None:
        try:
            self.stager.warm_up()
        except Exception:  # a cold kernel costs the first pause time, nothing else
            log.exception("warming up the CUDA kernels failed; the first update compiles them")
        try:
            super().run()
        finally:
            self.objects.close()

    # The loop's primitives.
    @property
    def live_version(self) -> int | None:
        return self.handoff.live_version

    @property
    def closed(self) -> bool:
        return self.handoff.closed

    def event(self, message: str, resync: bool = False) -> None:
        self.handoff.event(message, resync)

    def _back_off(self, seconds: float) -> None:
        self.metrics.retries.inc()
        self.handoff.sleep(seconds)

    def _give_up(self, error: SubscriberFailed) -> None:
        self.handoff.give_up(error)

    def _room(self) -> bool:
        self._verify_applied()
        if not self.handoff.wait_for_room():
            return False
        self._verify_applied()
        return True

    def _stage(self, plan: Plan) -> None:
        entry = plan.steps[0]
        pack = self.objects.fetch(entry)
        if pack is None:
            return  # the weights held stay the head: a failed anchor must not cost them
        if plan.chain_broken:
            self.resync(
                f"no chain of deltas from version {self.head} to {plan.target} "
                "(retention removed it, or its objects are set aside)"
            )
        if len(plan.steps) > 1:
            self.objects.prefetch(plan.steps[1])  # fetched while this one stages
        t0 = time.perf_counter()
        try:
            staged = self.stager.stage(entry, pack, self.head)
        except STAGE_ERRORS as exc:
            self._stage_failed(entry, pack, exc)
            return
        except Exception as exc:  # a decoder bug or a resource error: counted, set aside
            log.debug("staging %s raised", entry.key, exc_info=True)
            self.failures.strike(entry, f"staging {entry.key} raised {type(exc).__name__}: {exc}", staging=True)
            return
        self.stats.stage_s += time.perf_counter() - t0
        self.metrics.staged(time.perf_counter() - t0, _published_s(entry))
        self._staged(entry, staged)

    def _drop_head(self) -> None:
        self.head = self.head_entry = self.head_digests = None
        self.stats.resyncs += 1
        self.metrics.resynced()

    # The subscriber's own rules.
    def _verify_applied(self) -> None:
        """After a pause: the live weights must carry the last applied patch's digests, else
        resync."""
        staged = self.handoff.take_applied()
        if staged is None:
            return
        bad = self.stager.verify(staged)
        if bad:
            self.resync(
                f"after applying version {staged.version}, tensor {bad[0]!r} ({len(bad)} in all) lacks its digest",
                failed=True,
            )

    def _staged(self, entry: Entry, staged: StagedPatch | StagedParts) -> None:
        self.head, self.head_entry = entry.version, entry
        self.head_digests = {key: d for key, d, _ in patch_records(staged)}
        self._progressed(entry)
        self.handoff.push(entry, staged)

    def _stage_failed(self, entry: Entry, pack, exc: Exception) -> None:
        """A checked object failed to stage: set it aside for good, or resync when the
        weights are what is wrong (their digests are not the delta's base digests)."""
        if entry.kind == "snapshot":
            self.failures.set_broken(entry, f"snapshot {entry.key} does not fit the target: {exc}")
            return
        headers = [p.header for p in pack] if entry.parts else [pack.header]
        found = self.stager.base_digests(headers)
        stale = [
            r.name
            for h in headers
            for r in h.tensors
            if found.get(record_key(r.name, r.shape, r.box, r.order)) != r.base_digest
        ]
        if not stale:
            self.failures.set_broken(entry, f"delta {entry.key} fails on its own base weights: {exc}")
        elif self._holding_published_head(found):
            self.failures.set_broken(
                entry,
                f"delta {entry.key} was not encoded from version "
                f"{entry.base} as this store published it (tensor "
                f"{stale[0]!r}): {exc}",
            )
        else:
            self.resync(
                f"the weights are not the base of version {entry.version}'s delta "
                f"(tensor {stale[0]!r}, {len(stale)} in all): {exc}",
                failed=True,
            )

    def _holding_published_head(self, found: dict) -> bool:
        """Whether the weights are exactly what `head_entry` produced and the manifest still
        lists it: then a delta from `head` that disagrees is the delta's fault."""
        if self.head_entry is None or self.head_digests is None or self.manifest is None:
            return False
        if any(self.head_digests.get(key) != d for key, d in found.items()):
            return False  # modified since it was staged (the sampler wrote into them)
        return self.head_entry in self.manifest.entries


def _published_s(entry: Entry) -> float | None:
    """When `entry` was published, in Unix seconds (None: its manifest does not say)."""
    return entry.published_at_ms / 1000 if entry.published_at_ms else None
