import importlib.util
import os

import folders  # noqa: F401 (every test folder on sys.path)
import torch

# Without a GPU the CUDA backend's Triton kernels run in Triton's interpreter (the codec
# conformance suite's `triton-interpreter` backend, tests/codec/backends.py). Triton reads the
# mode when a kernel is defined, so it is set here, before any test imports triton; tests that
# need a GPU skip without one either way. Not in the vLLM suite's environment: its engines run
# in processes that inherit this one's environment, where Triton must compile as they expect.
if not torch.cuda.is_available() and importlib.util.find_spec("vllm") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    from hypothesis import settings
except ImportError:  # the vLLM suite's environment runs no property tests
    settings = None

# CI runs the same examples every time; local runs explore new ones.
if settings is not None:
    settings.register_profile("ci", derandomize=True, deadline=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")
