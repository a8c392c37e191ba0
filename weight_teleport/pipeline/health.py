"""A follower's health: its state, what went wrong, and when to give up.

A follower (a subscriber's, or an engine worker's) reports each failure and each step of
progress here. The log says once what is wrong (each distinct error of a failure streak),
again when a streak's failures reach 32, 64, 128... (a store down for hours logs a line
per doubling, not per attempt), and once when it recovers; every other attempt goes to the
debug level. Lines are key=value events (`observe/logs.py`), without tracebacks: these are
expected conditions."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, replace
from typing import Callable

from weight_teleport.observe.logs import kv
from weight_teleport.errors import WeightTeleportError

log = logging.getLogger("weight_teleport.subscribe.subscriber")

_TOLD_MAX = 32  # distinct errors logged per failure streak; later ones go to debug
_REMIND_FROM = 32  # a streak this long is logged again at each power of two


@dataclass(frozen=True)
class Health:
    """A snapshot of a follower's state (`Subscriber.health`; an engine worker's
    `WorkerLocal.status()["health"]`)."""

    state: str = "starting"
    """"starting": nothing staged yet and nothing failed. "healthy": the last step made
    progress (a new version staged, or the store has nothing newer). "degraded": the last
    tries failed, fewer than `fetch_attempts` in a row. "failing": `fetch_attempts` or more
    failures in a row, or one that retrying cannot fix (no plan reaches the latest version,
    a refused manifest, a snapshot that does not fit the target)."""
    last_error: str | None = None
    """The latest failure's message; kept after a recovery, for the record."""
    since: float = 0.0
    """`time.time()` when the state began."""
    consecutive_failures: int = 0
    """Failures since the last progress."""
    gave_up: bool = False
    """The subscriber stopped following (`SubscriberConfig.give_up_after_s`)."""


class SubscriberFailed(WeightTeleportError):
    """The subscriber gave up: it could not make progress for
    `SubscriberConfig.give_up_after_s`. Raised by `Subscriber.wait` and `apply`; the target
    keeps the last version applied, and `health` says what went wrong."""

    def __init__(self, message: str, health: Health):
        super().__init__(message)
        self.health = health
        """The subscriber's health when it gave up (its `last_error` is the cause)."""


def _shape(message: str) -> str:
    """A message with its numbers blanked: the same error with other timings is not news."""
    return re.sub(r"\d+(\.\d+)?", "#", message)


class HealthMonitor:
    """Turns the follower's failures and progress into `Health`, logs and a give-up time;
    `who` names the follower in its log events ("subscriber", "worker")."""

    def __init__(
        self,
        failing_after: int,
        give_up_after_s: float | None,
        on_change: Callable[[Health], None] | None = None,
        who: str = "subscriber",
    ):
        self.health = Health(since=time.time())
        self._who = who
        self._failing_after = max(1, failing_after)
        self._give_up_after_s = give_up_after_s
        self._on_change = on_change
        self._streak_start: float | None = None  # time.monotonic() of the streak's first failure
        self._told: set[str] = set()

    def failure(self, message: str, permanent: bool = False) -> None:
        """Record a failed step; `permanent`: retrying alone cannot fix it."""
        n = self.health.consecutive_failures + 1
        if self._streak_start is None:
            self._streak_start = time.monotonic()
        state = "failing" if permanent or n >= self._failing_after else "degraded"
        self._tell(state, message)
        self._set(replace(self.health, last_error=message, consecutive_failures=n), state)

    def progress(self, what: str) -> None:
        """Record a step that made progress (`what` happened); ends a failure streak."""
        h = self.health
        if h.state == "healthy" and not h.consecutive_failures:
            return
        if h.consecutive_failures:
            assert self._streak_start is not None  # set by the streak's first failure
            log.warning(
                "%s",
                kv(
                    f"{self._who}_recovered",
                    failures=h.consecutive_failures,
                    seconds=time.monotonic() - self._streak_start,
                    what=what,
                ),
            )
        self._streak_start, self._told = None, set()
        self._set(replace(h, consecutive_failures=0), "healthy")

    def backoff_s(self, first: float, cap: float) -> float:
        """The delay before the next try: `first` doubled per consecutive failure, at most `cap`."""
        n = self.health.consecutive_failures
        return 0.0 if n == 0 else min(first * 2 ** min(n - 1, 30), cap)

    def should_give_up(self) -> bool:
        """True once failures have lasted `give_up_after_s` with no progress."""
        return (
            self._give_up_after_s is not None
            and self._streak_start is not None
            and time.monotonic() - self._streak_start >= self._give_up_after_s
        )

    def give_up(self) -> SubscriberFailed:
        """Mark the subscriber as given up; the error `wait` and `apply` raise."""
        h = self.health
        elapsed = time.monotonic() - (self._streak_start or time.monotonic())
        message = (
            f"the subscriber gave up after {elapsed:.1f} s without progress "
            f"(SubscriberConfig.give_up_after_s={self._give_up_after_s}); last error: "
            f"{h.last_error}"
        )
        log.error("%s", kv(f"{self._who}_gave_up", seconds=elapsed, error=h.last_error))
        self._set(replace(h, gave_up=True), "failing")
        return SubscriberFailed(message, self.health)

    def _tell(self, state: str, message: str) -> None:
        """Log a failure unless this streak logged the same error already (turning to
        "failing" is always logged)."""
        shape, n = _shape(message), self.health.consecutive_failures + 1
        line = kv(f"{self._who}_failing" if state == "failing" else f"{self._who}_retrying", failures=n, error=message)
        if state == "failing" and self.health.state != "failing":
            log.error("%s", line)
        elif shape not in self._told and len(self._told) < _TOLD_MAX:
            log.log(logging.ERROR if state == "failing" else logging.WARNING, "%s", line)
        elif n >= _REMIND_FROM and n & (n - 1) == 0:
            log.warning("%s", kv(f"{self._who}_still_failing", failures=n, error=message))
        else:
            log.debug("%s", line)
            return
        self._told.add(shape)

    def _set(self, health: Health, state: str) -> None:
        """Make `health` (in `state`) current; tell `on_change` of a new state or a give-up."""
        changed = state != health.state or health.gave_up != self.health.gave_up
        if state != health.state:
            health = replace(health, state=state, since=time.time())
        self.health = health
        if changed and self._on_change is not None:
            try:
                self._on_change(health)
            except Exception:  # the host's callback must not stop the follower
                log.exception("SubscriberConfig.on_health raised; ignored")
