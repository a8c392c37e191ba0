"""The GPU benchmark scripts under bench/ run only on a GPU; the functions they time by name
must exist on every machine."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton)")


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
    yield
    for name in ("cuda_bench", "timeline", "stage_host"):
        sys.modules.pop(name, None)


def test_timed_functions_exist(bench):
    import cuda_bench
    import timeline
    spots = [*cuda_bench.encode_spots(), *cuda_bench.stage_spots(), *(s for v in timeline.SPOTS.values() for s in v)]
    missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in spots
               if not callable(getattr(owner, name, None))]
    assert not missing, missing
    assert len(spots) > 40


def test_stage_host_bench_runs(bench, monkeypatch, capsys):
    """bench/stage_host.py (the stage's host path on the CPU) on a small structured pack."""
    import stage_host
    monkeypatch.setattr(sys, "argv", ["stage_host.py", "--scale", "512", "--repeats", "1"])
    stage_host.main()
    out = capsys.readouterr().out
    assert "399 tensors" in out and "StreamsRead.result" in out
