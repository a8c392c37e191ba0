"""The vLLM kernels `targets.vllm_fp8` names are vLLM's own (a rename in a new vLLM would
otherwise refuse every block-FP8 engine, or let a rewriting kernel through)."""

import importlib
import pkgutil

import pytest

from engine_runs import NEEDS_VLLM
from weight_teleport.targets.vllm_fp8 import DEEP_GEMM, KEEPS_CHECKPOINT

pytestmark = pytest.mark.vllm


@NEEDS_VLLM
def test_named_kernels_exist_in_vllm():
    scaled_mm = importlib.import_module("vllm.model_executor.kernels.linear.scaled_mm")
    classes = set()
    for info in pkgutil.iter_modules(scaled_mm.__path__):
        try:
            module = importlib.import_module(f"{scaled_mm.__name__}.{info.name}")
        except ImportError:  # a platform's kernels that do not import here
            continue
        classes |= {n for n, v in vars(module).items() if isinstance(v, type)}
    assert set(KEEPS_CHECKPOINT + DEEP_GEMM) <= classes
