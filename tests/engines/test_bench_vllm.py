"""bench/vllm_tp.py runs end to end on a tiny model (TP=1 here; the benchmark's TP=2 figures
are in BENCHMARKS.md), one version: both routes commit it and every rank ends bit-exact."""

from pathlib import Path

import pytest
from engine_runs import NEEDS_VLLM, run_engine_script

pytestmark = pytest.mark.vllm


@NEEDS_VLLM
def test_vllm_tp_bench_small():
    script = Path(__file__).resolve().parents[2] / "bench" / "vllm_tp.py"
    run = run_engine_script(
        script, "--small", "--tp", 1, "--densities", "0.01", timeout=600, expect="OK: every rank bit-exact"
    )
    assert "| RPC bytes in the pause |" in run.stdout
