"""What the subscriber's follower thread and the sampler's `apply` share, under one lock:
the staged versions waiting for `apply`, the events for the next report, the version the
target holds, and whether the subscriber closed or gave up."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from weight_teleport.pipeline.health import SubscriberFailed
from weight_teleport.format.manifest import Entry

if TYPE_CHECKING:
    from weight_teleport.codec import StagedParts, StagedPatch

log = logging.getLogger(__name__)

MAX_EVENTS = 100
"""Distinct events kept between two `apply` calls (the oldest are dropped)."""


class Handoff:
    """Staged versions passed from the follower to `apply`. With `one_at_a_time` (staging
    against the target's own weights) one version is staged while none waits or is being
    applied; otherwise they queue up to `max_staged_bytes`."""

    def __init__(self, live_version: int | None, one_at_a_time: bool, max_staged_bytes: int):
        self._one_at_a_time, self._max_staged_bytes = one_at_a_time, max_staged_bytes
        self._cond = threading.Condition()
        self._pending: list[tuple[Entry, StagedPatch | StagedParts]] = []
        self._events: list[str] = []
        self._resynced = self._applying = self._closed = False
        self._failed: SubscriberFailed | None = None
        self._live_version = live_version
        self._applied: StagedPatch | StagedParts | None = None
        """The last patch applied to the target's weights, until its digests are checked."""

    @property
    def live_version(self) -> int | None:
        """The version the target holds (None before the first apply)."""
        return self._live_version

    @property
    def closed(self) -> bool:
        return self._closed

    # The follower's side.
    def event(self, message: str, resync: bool = False) -> None:
        """Note `message` for the next UpdateReport (each once, at most MAX_EVENTS); the
        health monitor logs failures, once each."""
        log.log(logging.INFO if resync else logging.DEBUG, "%s", message)
        with self._cond:
            if message not in self._events:
                if len(self._events) >= MAX_EVENTS:
                    del self._events[0]
                self._events.append(message)
            self._resynced = self._resynced or resync

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if the subscriber closes."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed, seconds)

    def give_up(self, error: SubscriberFailed) -> None:
        with self._cond:
            self._failed = error
            self._cond.notify_all()

    def wait_for_room(self) -> bool:
        """Block until another version may be staged; False once closed."""

        def room() -> bool:
            if self._closed:
                return True
            if self._one_at_a_time:
                return not self._pending and not self._applying
            staged = sum(s.nbytes for _, s in self._pending)
            return not self._pending or staged < self._max_staged_bytes

        with self._cond:
            self._cond.wait_for(room)
            return not self._closed

    def push(self, entry: Entry, staged: StagedPatch | StagedParts) -> None:
        with self._cond:
            if entry.kind == "snapshot":
                self._pending.clear()  # it overwrites whatever older patches would write
            self._pending.append((entry, staged))
            self._cond.notify_all()

    def take_applied(self) -> StagedPatch | StagedParts | None:
        """The last patch applied to the target's weights since the previous call, if any."""
        with self._cond:
            staged, self._applied = self._applied, None
        return staged

    # The sampler's side.
    def ready(self) -> bool:
        with self._cond:
            return bool(self._pending)

    def wait(self, timeout: float | None) -> bool:
        """Block until a staged version waits; False on timeout. Raises SubscriberFailed once
        the subscriber gave up and nothing staged is left."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._closed or self._failed, timeout)
            if not self._pending and self._failed is not None:
                raise self._failed
            return bool(self._pending)

    def begin_apply(self) -> tuple[list[tuple[Entry, StagedPatch | StagedParts]], list[str], bool]:
        """(every staged version, the events since the last apply, whether it resynced):
        taken for `apply`, which then writes them (no version is staged meanwhile in
        one-at-a-time mode). Raises SubscriberFailed once the subscriber gave up and nothing
        staged is left."""
        with self._cond:
            if not self._pending and self._failed is not None:
                raise self._failed
            pending, self._pending = self._pending, []
            events, resynced = self._events, self._resynced
            self._events, self._resynced, self._applying = [], False, bool(pending)
        return pending, events, resynced

    def end_apply(self, pending: list[tuple[Entry, StagedPatch | StagedParts]]) -> int | None:
        """`pending` (from `begin_apply`) is written: the target holds its last version,
        whose patch the follower checks next in one-at-a-time mode. Returns the version the
        target holds."""
        with self._cond:
            if pending:
                self._live_version = pending[-1][0].version
            if pending and self._one_at_a_time:
                self._applied = pending[-1][1]
            self._applying = False
            self._cond.notify_all()
            return self._live_version

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
