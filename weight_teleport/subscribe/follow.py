"""The loop every follower of a store runs: watch the manifest, plan, stage; recover.

A `Subscriber` (`pipeline/subscriber_follow.py`) and each engine worker
(`targets/worker_follow.py`) follow a store with `FollowLoop`. They differ only in its
primitives: the version plans start from (`head`), when another version may be staged
(`_room`), what stages the plan's first object and where the staged version goes
(`_stage`), what a resync drops (`_drop_head`), and where events, backoffs and a give-up
go (`event`, `_back_off`, `_give_up`).

Contracts: the manifest is read again before every step, and refused (kept out of every
plan) when it is malformed, badly signed (with `trusted_keys`), or older than what the
follower holds or saw listed (unless `follow_resets`). A manifest that lists the head's
version without the object it came from resyncs: a version is known by its content, not
its number. Plans avoid the objects that `failures` set aside (`pipeline/failures.py`).
Every failed step backs off, doubling; `HealthMonitor` tells the host how it goes and
decides when to give up."""

from __future__ import annotations

import abc
import logging

from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.errors import ManifestError, ManifestRollback, NoPlanError
from weight_teleport.pipeline.health import SubscriberFailed
from weight_teleport.subscribe.failures import Failures
from weight_teleport.pipeline.health import HealthMonitor
from weight_teleport.format.manifest import Entry, Manifest, from_json
from weight_teleport.pipeline.plan import Plan, plan_avoiding
from weight_teleport.format.signing import ManifestVerifier
from weight_teleport.store import Store, StoreError, manifest_etag

log = logging.getLogger(__name__)


class FollowLoop(abc.ABC):
    """The manifest accepted, the follower's health and its failures per object. It reads
    its rules from `config` (`watch_timeout_s`, `fetch_attempts`, `retry_backoff_s`,
    `retry_backoff_max_s`, `give_up_after_s`, `on_health`, `follow_resets`,
    `trusted_keys`); `floor` is the version held when it starts (None: none), an object is
    set aside after `set_aside_after` failures, and `who` names the follower in its logs."""

    RESET_HINT = "set SubscriberConfig.follow_resets=True to follow a deliberate reset"
    """How a user follows a store that went back, for the message refusing it."""

    head: int | None
    """The version the next object is staged against (None: no usable weights)."""
    head_entry: Entry | None
    """The object that produced `head` (None: a claimed version, or none)."""

    def __init__(self, config: SubscriberConfig, store: Store, *, floor: int | None, set_aside_after: int, who: str):
        self.config, self.store = config, store
        self.monitor = HealthMonitor(config.fetch_attempts, config.give_up_after_s, config.on_health, who)
        self.failures = Failures(set_aside_after, self._failed)
        self.verify = ManifestVerifier(config.trusted_keys) if config.trusted_keys else None
        """Checks the manifest's signature (ConfigError here for an unusable key)."""
        self.manifest: Manifest | None = None
        self.etag: str | None = None
        self.refused: str | None = None
        """Why the store's current manifest is refused (None: it is the accepted one)."""
        self.floor = floor
        """The newest version held or listed by an accepted manifest: an older latest
        version is a rollback."""
        self.highest: int | None = None
        """The newest version staged: staging a newer one is progress."""

    # The primitives each follower implements.
    @property
    @abc.abstractmethod
    def live_version(self) -> int | None:
        """The version the weights in use hold (None: unknown)."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether the follower was asked to stop."""

    @abc.abstractmethod
    def _room(self) -> bool:
        """Block until another version may be staged: True to go on with this step, False
        to end it (closed, or something else to do first)."""

    @abc.abstractmethod
    def _stage(self, plan: Plan) -> None:
        """Stage `plan`'s first object, note it (`_progressed`) and hand the staged version
        on, or count its failure in `failures`."""

    @abc.abstractmethod
    def _drop_head(self) -> None:
        """A resync: forget `head` and what was staged on it (plans start from an anchor)."""

    @abc.abstractmethod
    def event(self, message: str, resync: bool = False) -> None:
        """Tell the host `message` (a failure, a refusal, a resync: `resync`)."""

    @abc.abstractmethod
    def _back_off(self, seconds: float) -> None:
        """Wait `seconds` after a failed step (less where there is cause to try again)."""

    @abc.abstractmethod
    def _give_up(self, error: SubscriberFailed) -> None:
        """Stop following for good: `give_up_after_s` passed without progress."""

    # The loop.
    def run(self) -> None:
        """Follow the store until the follower closes or gives up."""
        while not self.closed:
            before = self.monitor.health.consecutive_failures
            try:
                self.step()
            except StoreError as exc:
                self.monitor.failure(f"cannot read the store: {exc}")
            except Exception as exc:  # keep following: a sampler must not lose its updates
                log.debug("unexpected error while following the store", exc_info=True)
                self.monitor.failure(f"unexpected {type(exc).__name__} while following the store: {exc}")
            if self.monitor.should_give_up():
                self._give_up(self.monitor.give_up())
                return
            if self.monitor.health.consecutive_failures > before:
                self._back_off(self.monitor.backoff_s(self.config.retry_backoff_s, self.config.retry_backoff_max_s))

    def step(self) -> None:
        """One turn: stage the next object of the plan, or wait for a new manifest."""
        if not self._room():
            return
        self._refresh(self.store.get_manifest())  # between steps: a few KB, parsed if new
        plan = self._plan()
        if plan is None:
            self._refresh(self.store.watch(self.etag, self.config.watch_timeout_s))
            return
        self._stage(plan)

    def resync(self, reason: str, failed: bool = False) -> None:
        """Start again from an anchor; `failed`: a failure (the weights were wrong), not a
        plan's choice (retention removed the chain)."""
        self._drop_head()
        self.event(f"resync from the latest anchor: {reason}", resync=True)
        if failed:
            self.monitor.failure(f"resync: {reason}")

    def _progressed(self, entry: Entry) -> None:
        """`entry` was staged and handed on: its failures are forgiven, and a version newer
        than every one staged before is progress."""
        self.failures.staged(entry)
        if self.highest is None or entry.version > self.highest:
            self.highest = entry.version
            self.monitor.progress(f"version {entry.version} staged")

    def _failed(self, why: str, permanent: bool) -> None:
        """A failure of one object (`failures` reports them here)."""
        self.event(why)
        self.monitor.failure(why, permanent=permanent)

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
            self.event(self.refused)
            return
        self.refused, self.manifest = None, manifest
        self.floor = _newest(self.floor, manifest.latest)
        self.failures.keep_listed({e.key for e in manifest.entries})
        self._check_head_listed(manifest)

    def _check_head_listed(self, manifest: Manifest) -> None:
        """Resync if `manifest` lists the head's version but not the object that produced
        it: the number names other weights now (a reset store, another run's history). A
        version no longer listed (retention) says nothing: its successors' base digests are
        checked when staged."""
        entry = self.head_entry
        if entry is None or entry in manifest.entries:
            return
        if any(e.version == entry.version for e in manifest.entries):
            self.resync(
                f"the store lists version {entry.version} without {entry.key}, the "
                f"object the weights held come from: other weights under that "
                f"number (a reset store, or another run)"
            )

    def _check_not_older(self, manifest: Manifest) -> None:
        """ManifestRollback for a manifest older than what this follower holds, unless it
        follows resets (then it forgets what it held and saw)."""
        held = _newest(self.floor, self.head, self.live_version)
        latest = manifest.latest
        if held is None or (latest is not None and latest >= held):
            return
        if not self.config.follow_resets:
            raise ManifestRollback(
                f"its latest version is {latest}, older than version {held} that this follower "
                f"holds or saw listed: the store was rolled back or reset ({self.RESET_HINT})"
            )
        self.event(
            f"the store went back from version {held} to {latest}: following the "
            "reset (SubscriberConfig.follow_resets)",
            resync=True,
        )
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
            plan = plan_avoiding(self.manifest, self.head, self.failures.set_aside() | broken.keys(), set(broken))
        except NoPlanError as exc:
            self.monitor.failure(f"{exc}{self.failures.note()}", permanent=True)
            return None
        if not plan.steps:
            self.monitor.progress(f"up to date at version {plan.target}")
            return None
        if plan.target != self.manifest.latest:
            self.event(
                f"version {self.manifest.latest} cannot be reached{self.failures.note()}: "
                f"following version {plan.target}, the newest that can be"
            )
        return plan


def _newest(*versions: int | None) -> int | None:
    known = [v for v in versions if v is not None]
    return max(known) if known else None
