"""The codec registry (format/codecs.py, codec/registry.py): every line names functions that
exist, the format's checks and the choices offered read it, neither backend imports the
other, and a codec without CUDA functions is coded and staged for CUDA tensors through the
CPU backend."""

import ast
import dataclasses
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch

import weight_teleport as wt
from weight_teleport.codec import registry
from weight_teleport.format import checks, read_header
from weight_teleport.format.codecs import CHOICES, CODECS, DEFAULT, Choice

CODEC = Path(registry.__file__).parent


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", list(CODECS))
def test_every_line_names_functions_that_exist(name):
    line = CODECS[name]
    assert line.name == name
    if line.family == "same":
        assert line.cpu is None and line.cuda is None
        return
    assert all(callable(f) for f in registry.cpu_coder(name))
    if line.family == "sparse":
        assert line.class_cost_bits > 0
    if line.cuda is not None and _has_triton():
        assert callable(registry.cuda_encoder(name)) and callable(registry.cuda_stager(name))


def test_the_format_and_the_choices_read_the_registry():
    from weight_teleport.cli import build_parser
    from weight_teleport.pipeline import PublisherConfig

    assert checks.CODECS == tuple(CODECS)
    assert checks.SNAPSHOT_CODECS == registry.SNAPSHOT == ("dense_values",)
    assert checks.DENSE_CODECS == registry.family("dense")
    assert CHOICES == (*registry.family("sparse"), "auto") == ("sparse", "sparse_ac", "auto")
    assert CHOICES[0] == DEFAULT and set(get_args(Choice)) == set(CHOICES)
    parse = lambda codec: build_parser().parse_args(["publish", "ckpt", "--to", "file:///s", "--codec", codec])
    assert [parse(c).codec for c in CHOICES] == [PublisherConfig(codec=c).codec for c in CHOICES] == list(CHOICES)
    with pytest.raises(SystemExit):
        parse("dense_values")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_neither_backend_imports_the_other():
    """The seam between the backends: what both use lives beside them in codec/, and the CUDA
    backend reaches the CPU's through the registry. codec/backend.py imports neither."""
    for side, other in (("cpu", "cuda"), ("cuda", "cpu")):
        for path in (CODEC / side).rglob("*.py"):
            bad = sorted(n for n in _imports(path) if n.startswith(f"weight_teleport.codec.{other}"))
            assert not bad, f"{path.relative_to(CODEC)} imports {bad}"
    bad = sorted(
        n
        for n in _imports(CODEC / "backend.py")
        if n.startswith(("weight_teleport.codec.cpu", "weight_teleport.codec.cuda"))
    )
    assert not bad


@pytest.mark.skipif(not _has_triton(), reason="the CUDA backend needs triton")
def test_a_sparse_chunk_staged_on_the_host_is_one_run_over_the_old_values():
    from weight_teleport.codec.cuda.stage.staging import _run
    from weight_teleport.codec.patch import ChunkPatch

    old = np.arange(100, dtype=np.uint16)
    run = _run(ChunkPatch(40, np.array([2, 5], np.int64), np.array([7, 9], np.uint16)), old)
    assert run.tolist() == [40, 41, 7, 43, 44, 9]
    assert _run(ChunkPatch(40, np.zeros(0, np.int64), np.zeros(0, np.uint16)), old).size == 0
    values = np.ones(8, np.uint16)
    assert _run(ChunkPatch(0, None, values), old) is values


def _states(seed: int):
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(300, 257, generator=g) * 0.02
    old = {"w": master.bfloat16(), "d": torch.randn(4096, generator=g), "s": torch.randn(64, generator=g)}
    new = {
        "w": (master + 2e-6 * torch.randn(300, 257, generator=g)).bfloat16(),
        "d": old["d"] + torch.randn(4096, generator=g),
        "s": old["s"].clone(),
    }
    return old, new


@pytest.mark.cuda
def test_a_codec_without_cuda_functions_goes_through_the_cpu(monkeypatch):
    """`sparse_ac`'s line without its CUDA encoder and stager: CUDA tensors' packs are the
    CPU's bytes, and they stage onto CUDA weights bit for bit (its chunks on the host)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setitem(CODECS, "sparse_ac", dataclasses.replace(CODECS["sparse_ac"], cuda=None))
    old, new = _states(1)
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=4096, codec="sparse_ac")
    codecs = [t.codec for t in read_header(pack).tensors]
    assert codecs[0] == "sparse_ac" and codecs[1].startswith("dense") and codecs[2] == "same"
    on_gpu = {k: v.cuda() for k, v in old.items()}
    gpu_pack = wt.encode_delta(
        on_gpu, {k: v.cuda() for k, v in new.items()}, base_version=0, version=1, chunk_elems=4096, codec="sparse_ac"
    )
    assert bytes(gpu_pack) == pack
    wt.apply_staged(on_gpu, wt.stage_delta(on_gpu, pack))
    assert all(torch.equal(on_gpu[k].cpu().view(torch.uint8), new[k].view(torch.uint8)) for k in new)
