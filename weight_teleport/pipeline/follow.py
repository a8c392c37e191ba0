"""The subscriber's background loop: watch, plan, fetch, check, stage; recover on failure.

Contracts: the manifest is read again before every step, and refused (kept out of every
plan) when it is malformed, badly signed, or older than what the subscriber holds. Plans
avoid the objects that `failures` set aside (`pipeline/failures.py`: failures counted per
object across fetches and stages). Weights that are not a delta's base cause at most one
resync per delta. Every failed step backs off, and `HealthMonitor` decides when the
subscriber gives up."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.observe.subscriber import SubscriberMetrics, Where
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.errors import ManifestError, ManifestRollback, NoPlanError
from weight_teleport.pipeline.failures import Failures
from weight_teleport.pipeline.fetch import Fetched
from weight_teleport.pipeline.handoff import Handoff
from weight_teleport.pipeline.health import HealthMonitor
from weight_teleport.pipeline.manifest import Entry, Manifest, from_json
from weight_teleport.pipeline.metrics import SubscriberStats
from weight_teleport.pipeline.objects import Objects
from weight_teleport.pipeline.plan import Plan, plan_avoiding
from weight_teleport.pipeline.signing import ManifestVerifier
from weight_teleport.pipeline.stager import Stager
from weight_teleport.pipeline.verify import patch_records, record_key
from weight_teleport.store import Store, StoreError, manifest_etag

if TYPE_CHECKING:
    from weight_teleport.codec import StagedPatch

log = logging.getLogger(__name__)

STAGE_ERRORS = (PackFormatError, PackMismatchError, DigestMismatchError)
"""What staging raises for a pack that does not fit the weights or is malformed."""


class Follower:
    """State of the background loop: the manifest seen, the staged head. It reads `store`
    (its objects through `objects`), stages with `stager`, hands staged versions to `apply`
    through `handoff`, and counts in `stats` and its `metrics`."""

    def __init__(self, config: SubscriberConfig, store: Store, stager: Stager, handoff: Handoff,
                 stats: SubscriberStats, head: int | None):
        self.config, self.store, self.stager, self.handoff, self.stats = config, store, stager, handoff, stats
        self.head = head
        """The version the next object is staged against (None: no usable weights)."""
        self.head_entry: Entry | None = None
        """The object that produced `head` (None: a claimed `initial_version`, or none)."""
        self.head_digests: dict | None = None
        """The digests `head_entry` promised for each record (by `verify.record_key`)."""
        self.highest: int | None = None
        """The newest version staged: staging a newer one is progress."""
        self.floor = head
        """The newest version held or listed by an accepted manifest: an older latest
        version is a rollback."""
        self.manifest: Manifest | None = None
        self.etag: str | None = None
        self.refused: str | None = None
        """Why the store's current manifest is refused (None: it is the accepted one)."""
        self.resync_reason: str | None = None
        self.monitor = HealthMonitor(self.config.fetch_attempts, self.config.give_up_after_s,
                                     self.config.on_health)
        self.verify = ManifestVerifier(self.config.trusted_keys) if self.config.trusted_keys \
            else None
        """Checks the manifest's signature (ConfigError here for an unusable key)."""
        self.metrics = SubscriberMetrics(self.config.metrics, self.where)
        """The subscriber's Prometheus metrics (`SubscriberConfig.metrics`): its gauges read
        `where()`."""
        self.failures = Failures(self.config.fetch_attempts, self._failed)
        """Failures per object: what plans avoid."""
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

    def _failed(self, why: str, permanent: bool) -> None:
        """A failure of one object (`failures` reports them here)."""
        self.handoff.event(why)
        self.monitor.failure(why, permanent=permanent)

    def request_resync(self, reason: str) -> None:
        """Restart from an anchor at the next step."""
        self.resync_reason = reason

    def run(self) -> None:
        """Follow the store until the subscriber closes or gives up."""
        try:
            self.stager.warm_up()
        except Exception:  # a cold kernel costs the first pause time, nothing else
            log.exception("warming up the CUDA kernels failed; the first update compiles them")
        try:
            self._run()
        finally:
            self.objects.close()

    def _run(self) -> None:
        while not self.handoff.closed:
            before = self.monitor.health.consecutive_failures
            try:
                self.step()
            except StoreError as exc:
                self.monitor.failure(f"cannot read the store: {exc}")
            except Exception as exc:  # keep following: a sampler must not lose its updates
                log.debug("unexpected error while following the store", exc_info=True)
                self.monitor.failure(f"unexpected {type(exc).__name__} while following the "
                                     f"store: {exc}")
            if self.monitor.should_give_up():
                self.handoff.give_up(self.monitor.give_up())
                return
            if self.monitor.health.consecutive_failures > before:
                self.metrics.retries.inc()
                self.handoff.sleep(self.monitor.backoff_s(self.config.retry_backoff_s,
                                                          self.config.retry_backoff_max_s))

    def step(self) -> None:
        """One turn: stage the next object of the plan, or wait for a new manifest."""
        self._verify_applied()
        if self.resync_reason is not None:
            reason, self.resync_reason = self.resync_reason, None
            self._resync(reason, failed=True)
        if not self.handoff.wait_for_room():
            return
        self._verify_applied()
        if self.resync_reason is not None:
            return  # the live weights lack the last patch's digests: resync at the next step
        self._refresh(self.store.get_manifest())  # between steps: a few KB, parsed if new
        plan = self._plan()
        if plan is None:
            self._refresh(self.store.watch(self.etag, self.config.watch_timeout_s))
            return
        entry = plan.steps[0]
        pack = self.objects.fetch(entry)
        if pack is None:
            return  # the weights held stay the head: a failed anchor must not cost them
        if plan.chain_broken:
            self._resync(f"no chain of deltas from version {self.head} to {plan.target} "
                         "(retention removed it, or its objects are set aside)")
        if len(plan.steps) > 1:
            self.objects.prefetch(plan.steps[1])  # fetched while this one stages
        self._stage(entry, pack)

    def _verify_applied(self) -> None:
        """After a pause: the live weights must carry the last applied patch's digests, else
        the next step resyncs."""
        staged = self.handoff.take_applied()
        if staged is None:
            return
        bad = self.stager.verify(staged)
        if bad:
            self.request_resync(f"after applying version {staged.version}, tensor "
                                f"{bad[0]!r} ({len(bad)} in all) lacks its digest")

    # The manifest.
    def _refresh(self, raw: bytes | None) -> None:
        """Take `raw` as the store's manifest if it is new and acceptable."""
        if raw is None:
            return
        etag = manifest_etag(raw)
        if etag == self.etag:
            return
        self.etag = etag
        try:
            manifest = from_json(raw, verify=self.verify)
            self._check_not_older(manifest)
        except ManifestError as exc:
            self.refused = f"refusing the store's manifest: {exc}"
            self.handoff.event(self.refused)
            return
        self.refused, self.manifest = None, manifest
        self.floor = _newest(self.floor, manifest.latest)
        self.failures.keep_listed({e.key for e in manifest.entries})
        self._check_head_listed(manifest)

    def _check_head_listed(self, manifest: Manifest) -> None:
        """Resync if `manifest` lists the head's version but not the object that produced
        it: the number names other weights now (a reset store, another run's history), and
        a version is known by its content, not by its number. A version no longer listed
        (retention) says nothing: its successors' base digests are checked when staged."""
        entry = self.head_entry
        if entry is None or entry in manifest.entries:
            return
        if any(e.version == entry.version for e in manifest.entries):
            self._resync(f"the store lists version {entry.version} without {entry.key}, the "
                         f"object the weights held come from: other weights under that "
                         f"number (a reset store, or another run)")

    def _check_not_older(self, manifest: Manifest) -> None:
        """ManifestRollback for a manifest older than what this subscriber holds, unless it
        follows resets (then it forgets what it held and saw)."""
        held = _newest(self.floor, self.head, self.handoff.live_version)
        latest = manifest.latest
        if held is None or (latest is not None and latest >= held):
            return
        if not self.config.follow_resets:
            raise ManifestRollback(
                f"its latest version is {latest}, older than version {held} that this subscriber "
                "holds or saw listed: the store was rolled back or reset (set "
                "SubscriberConfig.follow_resets=True to follow a deliberate reset)")
        self.handoff.event(f"the store went back from version {held} to {latest}: following the "
                        "reset (SubscriberConfig.follow_resets)", resync=True)
        self.floor = self.highest = None
        self.failures.forget()

    def _plan(self) -> Plan | None:
        """The plan to follow now, or None (nothing to do, or nothing possible)."""
        if self.refused is not None:
            self.monitor.failure(self.refused, permanent=True)
            return None
        if self.manifest is None:
            return None
        broken = self.failures.broken
        try:
            plan = plan_avoiding(self.manifest, self.head, self.failures.set_aside() | broken.keys(),
                                 set(broken))
        except NoPlanError as exc:
            self.monitor.failure(f"{exc}{self.failures.note()}", permanent=True)
            return None
        if not plan.steps:
            self.monitor.progress(f"up to date at version {plan.target}")
            return None
        if plan.target != self.manifest.latest:
            self.handoff.event(f"version {self.manifest.latest} cannot be reached"
                               f"{self.failures.note()}: following version {plan.target}, the "
                               f"newest that can be")
        return plan

    # Staging.
    def _stage(self, entry: Entry, pack: Fetched | list[Fetched]) -> None:
        t0 = time.perf_counter()
        try:
            staged = self.stager.stage(entry, pack, self.head)
        except STAGE_ERRORS as exc:
            self._stage_failed(entry, pack, exc)
            return
        except Exception as exc:  # a decoder bug or a resource error: counted, set aside
            log.debug("staging %s raised", entry.key, exc_info=True)
            self.failures.strike(entry, f"staging {entry.key} raised {type(exc).__name__}: {exc}",
                                 staging=True)
            return
        self.stats.stage_s += time.perf_counter() - t0
        self.metrics.staged(time.perf_counter() - t0, _published_s(entry))
        self._staged(entry, staged)

    def _staged(self, entry: Entry, staged: "StagedPatch") -> None:
        self.failures.staged(entry)
        self.head, self.head_entry = entry.version, entry
        self.head_digests = {key: d for key, d, _ in patch_records(staged)}
        if self.highest is None or entry.version > self.highest:
            self.highest = entry.version
            self.monitor.progress(f"version {entry.version} staged")
        self.handoff.push(entry, staged)

    def _stage_failed(self, entry: Entry, pack, exc: Exception) -> None:
        """A checked object failed to stage: set it aside for good, or resync when the
        weights are what is wrong (their digests are not the delta's base digests)."""
        if entry.kind == "snapshot":
            self.failures.set_broken(entry, f"snapshot {entry.key} does not fit the target: {exc}")
            return
        headers = [p.header for p in pack] if entry.parts else [pack.header]
        found = self.stager.base_digests(headers)
        stale = [r.name for h in headers for r in h.tensors
                 if found.get(record_key(r.name, r.shape, r.box, r.order)) != r.base_digest]
        if not stale:
            self.failures.set_broken(entry, f"delta {entry.key} fails on its own base weights: {exc}")
        elif self._holding_published_head(found):
            self.failures.set_broken(entry, f"delta {entry.key} was not encoded from version "
                                            f"{entry.base} as this store published it (tensor "
                                            f"{stale[0]!r}): {exc}")
        else:
            self._resync(f"the weights are not the base of version {entry.version}'s delta "
                         f"(tensor {stale[0]!r}, {len(stale)} in all): {exc}", failed=True)

    def _holding_published_head(self, found: dict) -> bool:
        """Whether the weights are exactly what `head_entry` produced and the manifest still
        lists it: then a delta from `head` that disagrees is the delta's fault."""
        if self.head_entry is None or self.head_digests is None or self.manifest is None:
            return False
        if any(self.head_digests.get(key) != d for key, d in found.items()):
            return False  # modified since it was staged (the sampler wrote into them)
        return self.head_entry in self.manifest.entries

    def _resync(self, reason: str, failed: bool = False) -> None:
        """Start again from an anchor; `failed`: a failure (the weights were wrong), not a
        plan's choice (retention removed the chain)."""
        self.head = self.head_entry = self.head_digests = None
        self.stats.resyncs += 1
        self.metrics.resynced()
        self.handoff.event(f"resync from the latest anchor: {reason}", resync=True)
        if failed:
            self.monitor.failure(f"resync: {reason}")


def _published_s(entry: Entry) -> float | None:
    """When `entry` was published, in Unix seconds (None: its manifest does not say)."""
    return entry.published_at_ms / 1000 if entry.published_at_ms else None


def _newest(*versions: int | None) -> int | None:
    known = [v for v in versions if v is not None]
    return max(known) if known else None
