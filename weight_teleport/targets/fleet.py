"""The trainer's view of its samplers: commit a version on every engine, keep what each one
holds, and wait, where asked, until enough of them hold it (bounded staleness). No vLLM here:
the commit of one engine is a callable (`vllm_trainer.py` passes vLLM's calls).

Every engine is reported, whatever its outcome: "APPLIED", "SKIPPED" (its workers had not
staged the version: committed again later), "RESYNC" (a worker failed to stage or verify it:
its workers stage again), "FAILED" (the commit raised: the engine is down or refused a call)
or "UNCONFIRMED" (its client reports no outcome: vLLM's four-method sync clients return
nothing, so what such an engine holds is unknown and it never counts as holding a version).
An engine that lags past what `FleetWait` allows makes the wait fail with `FleetLagging`,
which carries the report, after `FleetWait.timeout_s` and the commit round in flight."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from weight_teleport.errors import ConfigError, WeightTeleportError

_log = logging.getLogger(__name__)

APPLIED, SKIPPED, RESYNC, FAILED, UNCONFIRMED = "APPLIED", "SKIPPED", "RESYNC", "FAILED", "UNCONFIRMED"


@dataclass(frozen=True)
class FleetWait:
    """When a version sent counts as delivered. Both bounds may be set: both must hold.
    Neither: one commit round, whatever its outcomes (still reported)."""

    min_applied: int | None = None
    """At least this many engines have applied the version."""
    max_lag: int | None = None
    """Every engine holds a version at most this many behind the one sent (0: all applied it).
    An engine whose holding is unknown (FAILED from the start, UNCONFIRMED) never meets it."""
    timeout_s: float = 120.0
    """How long to commit again on the engines that do not hold the version, before
    `FleetLagging`."""
    retry_s: float = 1.0
    """Between commit rounds, and the longest a later round's commit waits for a worker's
    stage (the engine is paused meanwhile; between rounds it generates and stages)."""

    def __post_init__(self) -> None:
        for name in ("min_applied", "max_lag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigError(f"FleetWait.{name} must be a non-negative int or None, not {value!r}")
        if not self.timeout_s >= 0 or not self.retry_s > 0:
            raise ConfigError(
                f"FleetWait needs timeout_s >= 0 and retry_s > 0, not {self.timeout_s!r}, {self.retry_s!r}"
            )

    def check(self, engines: int, confirmable: int) -> None:
        """Refuse a wait these engines can never meet (`confirmable`: those whose client
        reports outcomes)."""
        if self.min_applied is not None and self.min_applied > confirmable:
            raise ConfigError(
                f"FleetWait.min_applied={self.min_applied}, but only {confirmable} of {engines} "
                "engines report what they apply"
            )
        if self.max_lag is not None and confirmable < engines:
            raise ConfigError(
                f"FleetWait.max_lag needs every engine to report what it applies; "
                f"{engines - confirmable} of {engines} cannot (their clients return nothing)"
            )


@dataclass
class EngineState:
    """One engine, as the trainer knows it."""

    name: str
    held: int | None = None
    """The newest version the engine is known to hold; None: unknown."""
    outcome: str | None = None
    """The outcome of the last commit ("APPLIED", ..., module docstring)."""
    error: str | None = None
    """Why the last commit failed (outcome "FAILED")."""
    commits: int = 0
    """Commits of the last version sent, this one included."""

    def lag(self, version: int) -> int | None:
        """Versions behind `version`; None: unknown."""
        return None if self.held is None else version - self.held


@dataclass
class SyncReport:
    """The fleet after a version was sent: every engine, lagging and failed ones included."""

    version: int
    engines: list[EngineState]
    met: bool
    """The `FleetWait` held (True without one)."""
    waited_s: float = 0.0
    rounds: int = 1

    def outcomes(self) -> dict[str, str | None]:
        return {e.name: e.outcome for e in self.engines}

    @property
    def applied(self) -> list[str]:
        return [e.name for e in self.engines if e.held == self.version]

    @property
    def lagging(self) -> list[str]:
        """Engines that do not hold the version (failed ones included)."""
        return [e.name for e in self.engines if e.held != self.version]

    @property
    def failed(self) -> list[str]:
        return [e.name for e in self.engines if e.outcome == FAILED]

    def describe(self) -> str:
        rows = [
            f"{e.name}: {e.outcome}, holds {e.held if e.held is not None else 'unknown'}"
            + (f" ({e.lag(self.version)} behind)" if e.held is not None and e.held != self.version else "")
            + (f", error: {e.error}" if e.error else "")
            for e in self.engines
        ]
        return f"version {self.version} after {self.rounds} round(s), {self.waited_s:.1f} s: " + "; ".join(rows)


class FleetLagging(WeightTeleportError, TimeoutError):
    """Engines did not reach what `FleetWait` asks within its timeout; `report` names each."""

    def __init__(self, message: str, report: SyncReport) -> None:
        super().__init__(message)
        self.report = report


def met(engines: Sequence[EngineState], version: int, wait: FleetWait | None) -> bool:
    """Whether `engines` hold `version` as `wait` asks."""
    if wait is None:
        return True
    ok = True
    if wait.min_applied is not None:
        ok = sum(e.held == version for e in engines) >= wait.min_applied
    if wait.max_lag is not None:
        ok = ok and all(e.held is not None and version - e.held <= wait.max_lag for e in engines)
    return ok


Commit = Callable[[int, int, "float | None"], "tuple[str, int | None]"]
"""commit(engine index, version, wait_s) -> (outcome, the version the engine holds after it,
None where unknown); wait_s None: the engine's own default. Raising: the engine FAILED."""


@dataclass
class Fleet:
    """The engines a trainer sends to, and what each holds."""

    engines: list[EngineState]
    commit: Commit
    wait: FleetWait | None = None
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def send(self, version: int) -> SyncReport:
        """Commit `version` on every engine (at once), then again on those that do not hold
        it until `wait` is met; raise FleetLagging on its timeout. Returns the report."""
        t0 = time.monotonic()
        for e in self.engines:
            e.commits, e.error = 0, None
        self._round(self.engines, version, None)
        rounds = 1
        wait = self.wait
        while not met(self.engines, version, wait):
            assert wait is not None
            left = wait.timeout_s - (time.monotonic() - t0)
            if left <= 0:
                report = SyncReport(version, self.engines, False, time.monotonic() - t0, rounds)
                raise FleetLagging(
                    f"the fleet did not reach {wait} within {wait.timeout_s} s: {report.describe()}", report
                )
            time.sleep(min(wait.retry_s, left))
            behind = [e for e in self.engines if e.held != version]
            self._round(behind, version, max(0.0, min(wait.retry_s, wait.timeout_s - (time.monotonic() - t0))))
            rounds += 1
        report = SyncReport(version, self.engines, True, time.monotonic() - t0, rounds)
        if report.lagging:
            _log.warning("%s", report.describe())
        return report

    def _round(self, engines: list[EngineState], version: int, wait_s: float | None) -> None:
        if not engines:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(1, len(self.engines)), thread_name_prefix="weight-teleport-fleet")
        index = {id(e): i for i, e in enumerate(self.engines)}
        futures = [(e, self._pool.submit(self.commit, index[id(e)], version, wait_s)) for e in engines]
        for e, future in futures:
            e.commits += 1
            try:
                outcome, held = future.result()
            except Exception as exc:  # the engine is reported FAILED; the others go on
                e.outcome, e.error = FAILED, f"{type(exc).__name__}: {exc}"
                _log.warning("engine %s: committing version %d failed: %s", e.name, version, e.error)
                continue
            e.outcome, e.error = outcome, None
            if held is not None:
                e.held = held
            elif outcome == UNCONFIRMED:
                e.held = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
