"""Every codec backend implements the interface codec/api.py calls (codec/backend.py):
its parameters first, in order, then only parameters with defaults."""

import inspect

import pytest

from weight_teleport.codec.backend import Backend

MEMBERS = ("item", "walk_item", "encode", "check_stage", "stage", "bind", "digest", "digests")


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("name", ["cpu", "cuda"])
def test_backends_implement_the_protocol(name):
    if name == "cuda":
        pytest.importorskip("triton", reason="the CUDA backend needs triton")
    from importlib import import_module

    backend = import_module(f"weight_teleport.codec.{name}.backend")
    assert isinstance(backend, Backend)
    for member in MEMBERS:
        want, have = _params(getattr(Backend, member)), _params(getattr(backend, member))
        assert [p.name for p in have[: len(want)]] == [p.name for p in want], member
        assert all(p.default is not inspect.Parameter.empty for p in have[len(want) :]), member
