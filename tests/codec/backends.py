"""The codec's backends as the conformance suite (tests/codec/test_conformance.py) runs them,
one fixture parameter each:

- `cpu`: CPU tensors, the CPU backend.
- `triton-interpreter`: CPU tensors, the CUDA backend, its Triton kernels run by Triton's
  interpreter. The interpreter is chosen per process, before triton is imported:
  tests/conftest.py sets TRITON_INTERPRET=1 where torch sees no GPU, and this parameter runs
  only in such a process (on a GPU the same checks run compiled, as `cuda`).
- `cuda`: CUDA tensors, the CUDA backend's compiled kernels; skipped without a GPU.

A backend moves states onto its device (`to`) and back (`host`), and within `active()` the
codec's API runs its code (the interpreter's tensors are CPU tensors, which the API would
hand to the CPU backend). References are computed outside `active()` on CPU tensors: the
CPU backend's packs and results."""

from __future__ import annotations

import contextlib
import importlib.util
import os

import numpy as np
import pytest
import torch

from helpers import bits, with_renewed_crcs

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Whether this process runs Triton kernels in Triton's interpreter (fixed at start)."""
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()

CPU, INTERPRETER, CUDA = "cpu", "triton-interpreter", "cuda"
ALL = [CPU, INTERPRETER, CUDA]
GPU_PATH = [INTERPRETER, CUDA]
"""The backends that run the CUDA backend's code (its kernels, its pack writer, its stager)."""


class Backend:
    """One backend of the suite: where its tensors live and how the API reaches its code."""

    def __init__(self, name: str, device: str, gpu_path: bool):
        self.name, self.device, self.gpu_path = name, device, gpu_path

    def __repr__(self) -> str:
        return self.name

    def to(self, state: dict) -> dict:
        """Copies of `state`'s tensors on this backend's device (never the tensors themselves:
        a test's reference states stay as they are)."""
        return {k: self.tensor(v) for k, v in state.items()}

    def inputs(self, state: dict) -> dict:
        """`state`'s tensors on this backend's device, for reading only: the tensors themselves
        where they are there already (views off alignment stay so), else copies."""
        return {k: v if v.device.type == self.device else v.to(self.device) for k, v in state.items()}

    def host(self, state: dict) -> dict:
        """`state`'s tensors on the CPU."""
        return {k: v.cpu() for k, v in state.items()}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` on this backend's device (its strides kept)."""
        return t.to(self.device, copy=True)

    def active(self):
        """A context within which the API runs this backend's code on its tensors."""
        return contextlib.nullcontext()


class Interpreter(Backend):
    """The CUDA backend on CPU tensors: `active()` points the API's backend choice at it."""

    def __init__(self, monkeypatch):
        super().__init__(INTERPRETER, "cpu", True)
        from weight_teleport.codec.cuda.runtime import memory

        # the interpreter runs the kernels on CPU tensors, and there is no pinned memory
        monkeypatch.setattr(memory, "on_device", lambda t: True)
        monkeypatch.setattr(memory, "pinned_empty", lambda n: np.empty(n, np.uint8))

    @contextlib.contextmanager
    def active(self):
        from weight_teleport.codec import api
        from weight_teleport.codec.cuda import backend as gpu

        choose = api._backend
        api._backend = lambda tensors: gpu
        try:
            yield
        finally:
            api._backend = choose


def skip_reason(name: str) -> str | None:
    """Why backend `name` cannot run in this process, or None."""
    if name == CPU:
        return None
    if not HAS_TRITON:
        return "triton is not installed (pip install triton)"
    if name == INTERPRETER and not INTERPRETED:
        return (
            "Triton's interpreter is chosen per process before triton is imported; this "
            "process has a GPU and runs the kernels compiled (the cuda parameter)"
        )
    if name == CUDA and not HAS_CUDA:
        return "needs an NVIDIA GPU (torch.cuda)"
    if name == CUDA and INTERPRETED:
        return "this process runs Triton kernels in the interpreter (TRITON_INTERPRET=1)"
    return None


def make(name: str, monkeypatch) -> Backend:
    """Backend `name`, skipping the test where it cannot run here."""
    reason = skip_reason(name)
    if reason is not None:
        pytest.skip(reason)
    if name == INTERPRETER:
        return Interpreter(monkeypatch)
    return Backend(name, "cuda" if name == CUDA else "cpu", name == CUDA)


def params(names) -> list:
    """pytest params of backends `names`, the cuda one marked `cuda`."""
    return [pytest.param(n, id=n, marks=[pytest.mark.cuda] if n == CUDA else []) for n in names]


@pytest.fixture(params=params(ALL))
def backend(request, monkeypatch) -> Backend:
    """Each backend (skipped where it cannot run in this process)."""
    return make(request.param, monkeypatch)


@pytest.fixture(params=params(GPU_PATH))
def gpu_backend(request, monkeypatch) -> Backend:
    """Each backend that runs the CUDA backend's code (kernels, pack writer, stager)."""
    return make(request.param, monkeypatch)


def pair(dtype, n, density, seed):
    """(old, new) of `n` elements of `dtype`, about `density` of them changed (weight-like
    floats moved by a few percent, integers by one)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        old = (torch.randn(n, generator=g) * 0.02).to(dtype)
        changed = torch.rand(n, generator=g) < density
        new = torch.where(changed, (old.float() * (1 + 0.05 * torch.randn(n, generator=g))).to(dtype), old)
    else:
        old = torch.randint(-100, 100, (n,), generator=g).to(dtype)
        new = torch.where(torch.rand(n, generator=g) < density, old + 1, old)
    return old, new


def same_bits(a: dict, b: dict) -> bool:
    """Whether the tensors of `b` hold the bit patterns of those of `a` (compared on the CPU)."""
    return all(torch.equal(bits(a[k].cpu()), bits(b[k].cpu())) for k in b)


def corrupt(pack: bytes, index: int, at: int, value: int) -> bytes:
    """`pack` with byte `at` of its chunk `index` set to `value`, the chunk's CRC renewed."""

    def mutate(i: int, data: bytearray) -> None:
        if i == index:
            data[at % len(data)] = value

    return with_renewed_crcs(pack, mutate)
