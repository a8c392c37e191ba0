"""The trainer's fleet (targets/fleet.py), without engines: each engine's commit is a function
of (engine, version, wait_s), as `vllm_trainer.TeleportTrainerEngine._commit` is. The vLLM
suite drives the same code against a real `vllm serve` (tests/engines/test_vllm_trainer.py)."""

import time

import pytest

from weight_teleport.errors import ConfigError
from weight_teleport.targets.fleet import EngineState, Fleet, FleetLagging, FleetWait, met


def _engines(n: int, held: int | None = 0) -> list[EngineState]:
    return [EngineState(f"e{i}", held) for i in range(n)]


def test_met_counts_applied_engines_and_bounds_the_lag():
    engines = [EngineState("a", 5), EngineState("b", 4), EngineState("c", None)]
    assert met(engines, 5, None)
    assert met(engines, 5, FleetWait(min_applied=1)) and not met(engines, 5, FleetWait(min_applied=2))
    assert not met(engines, 5, FleetWait(max_lag=3)), "an engine whose holding is unknown never meets a lag bound"
    engines[2].held = 4
    assert met(engines, 5, FleetWait(max_lag=1)) and not met(engines, 5, FleetWait(max_lag=0))
    assert not met(engines, 5, FleetWait(min_applied=1, max_lag=0))


def test_fleet_wait_refuses_what_it_cannot_wait_for():
    with pytest.raises(ConfigError):
        FleetWait(min_applied=-1)
    with pytest.raises(ConfigError):
        FleetWait(retry_s=0)
    with pytest.raises(ConfigError, match="min_applied=3"):
        FleetWait(min_applied=3).check(engines=3, confirmable=2)
    with pytest.raises(ConfigError, match="max_lag"):
        FleetWait(max_lag=1).check(engines=3, confirmable=2)
    FleetWait(min_applied=2).check(engines=3, confirmable=2)


def test_a_failed_engine_is_reported_beside_the_applied_ones():
    def commit(i, version, wait_s):
        if i == 1:
            raise ConnectionRefusedError("engine down")
        return "APPLIED", version

    fleet = Fleet(_engines(3), commit, FleetWait(min_applied=2))
    report = fleet.send(1)
    fleet.close()
    assert report.met and report.applied == ["e0", "e2"] and report.failed == ["e1"] == report.lagging
    assert report.engines[1].held == 0 and "engine down" in report.engines[1].error
    assert "e1: FAILED, holds 0 (1 behind), error: ConnectionRefusedError: engine down" in report.describe()


def test_a_lagging_engine_is_committed_again_until_it_holds_the_version():
    calls = []

    def commit(i, version, wait_s):
        calls.append((i, wait_s))
        if i == 1 and len([c for c in calls if c[0] == 1]) < 3:
            return "SKIPPED", version - 1
        return "APPLIED", version

    fleet = Fleet(_engines(2), commit, FleetWait(max_lag=0, timeout_s=30, retry_s=0.01))
    report = fleet.send(1)
    fleet.close()
    assert report.met and report.rounds == 3 and report.applied == ["e0", "e1"]
    assert calls[:2] in ([(0, None), (1, None)], [(1, None), (0, None)]), "the first round: the engines' own wait"
    assert [c for c in calls[2:]] == [(1, pytest.approx(0.01, abs=0.01))] * 2, "later rounds: the lagging engine alone"
    assert report.engines[1].commits == 3


def test_an_engine_that_never_catches_up_fails_the_wait_in_bounded_time():
    fleet = Fleet(
        _engines(2),
        lambda i, v, w: ("APPLIED", v) if i == 0 else ("SKIPPED", v - 2),
        FleetWait(max_lag=1, timeout_s=0.3, retry_s=0.05),
    )
    t0 = time.monotonic()
    with pytest.raises(FleetLagging) as caught:
        fleet.send(7)
    fleet.close()
    assert time.monotonic() - t0 < 2.0
    report = caught.value.report
    assert not report.met and report.lagging == ["e1"] and report.engines[1].lag(7) == 2 and report.rounds > 1
    assert "e1: SKIPPED, holds 5 (2 behind)" in str(caught.value)


def test_without_a_wait_one_round_reports_every_outcome():
    outcomes = ["APPLIED", "RESYNC", "UNCONFIRMED"]
    fleet = Fleet(_engines(3, held=None), lambda i, v, w: (outcomes[i], v if i == 0 else None))
    report = fleet.send(0)
    fleet.close()
    assert report.met and report.rounds == 1
    assert report.outcomes() == {"e0": "APPLIED", "e1": "RESYNC", "e2": "UNCONFIRMED"}
    assert report.lagging == ["e1", "e2"]
