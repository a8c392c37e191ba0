"""The CUDA backend's snapshot path on a machine without a GPU: tests/cuda_snapshot_interpreter.py
runs its kernels in Triton's interpreter (packs the CPU reads bit-exact, stage + apply
bit-exact, a corrupt plane refused). Skipped where triton is not installed."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton)")


def test_snapshot_kernels_in_the_triton_interpreter():
    script = Path(__file__).resolve().parents[1] / "cuda_snapshot_interpreter.py"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         cwd=script.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "snapshot path ok" in run.stdout
