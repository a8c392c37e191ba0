"""The CUDA backend's Triton kernels on a machine without a GPU: tests/cuda_interpreter.py
runs them in Triton's interpreter (GPU-path packs byte-identical to the CPU's, stage + apply
bit-exact, corrupt chunks refused, versions made of parts staged against whole tensors,
`sparse_ac` packs staged, a TP worker's slices staged in part), in six parts that
workers can run side by side.
Skipped where triton is not installed.

The interpreter runs a kernel's programs one by one in Python: the script's states are a
few chunks each, and nothing here bounds its time (a busy machine is slow, not wrong)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton)")


@pytest.mark.parametrize("part", ["states-a", "states-b", "kernels", "parts", "slices", "adaptive"])
def test_cuda_kernels_in_the_triton_interpreter(part):
    script = Path(__file__).resolve().parents[1] / "cuda_interpreter.py"
    # TRITON_INTERPRET must be set before triton is imported; the checkout's package first
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(script.parents[1]), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(script), part], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{part}: 0 failures" in run.stdout
