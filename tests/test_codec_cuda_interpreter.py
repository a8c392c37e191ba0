"""The CUDA backend's Triton kernels on a machine without a GPU: tests/cuda_interpreter.py
runs them in Triton's interpreter (GPU-path packs byte-identical to the CPU's, stage + apply
bit-exact, corrupt chunks refused). Skipped where triton is not installed."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton)")


def test_cuda_kernels_in_the_triton_interpreter():
    script = Path(__file__).with_name("cuda_interpreter.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "corruptions refused:" in run.stdout
