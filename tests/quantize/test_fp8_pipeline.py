"""A publisher that quantizes (`PublisherConfig.sampler_format="fp8-block"`) feeds samplers
that hold the block-FP8 checkpoint: after every version their float8 weights and scales
equal the quantization of the trainer's weights, bit for bit, including blocks whose scale
moved; the trainer's tensors never reach the store; a weight that cannot be quantized is
refused before anything is published; `pull` writes a checkpoint whose config names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import bits
from weight_versions import FAST, expected, follow, memory_url
from weight_teleport import Publisher, PublisherConfig, Subscriber, TorchTarget, decode_snapshot
from weight_teleport.cli import main
from weight_teleport.errors import QuantizationError
from weight_teleport.quantize import sampler_format

FMT = sampler_format("fp8-block")


def quantized(state: dict[str, torch.Tensor], device: str = "cpu") -> dict[str, torch.Tensor]:
    out = {k: torch.empty(s, dtype=dt, device=device) for k, (s, dt) in FMT.layout(state).items()}
    FMT.quantize(state, out)
    return out


def same(live: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return live.keys() == want.keys() and all(torch.equal(bits(live[k]).cpu(), bits(want[k]).cpu()) for k in want)


def scale_moves(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    return sum(int((bits(a[k]) != bits(b[k])).sum()) for k in a if k.endswith("_scale_inv"))


def run(url: str, versions: int, device: str, config: PublisherConfig) -> list[int]:
    """Publish `versions` of the test weights (on `device`), quantized, to a subscriber
    whose TorchTarget holds the quantized checkpoint on `device`; the scales that moved."""
    on = lambda state: {k: t.to(device) for k, t in state.items()}
    live = {k: torch.zeros_like(t) for k, t in quantized(on(expected(0)), device).items()}
    moved = []
    with Publisher(url, config) as pub, Subscriber(url, TorchTarget(live), FAST) as sub:
        for v in range(versions):
            pub.publish(on(expected(v)), v).wait(60)
            follow(sub, v)
            want = quantized(expected(v))
            assert same(live, want), f"version {v} differs from the quantized trainer weights"
            moved.append(scale_moves(want, quantized(expected(v - 1))) if v else 0)
    return moved


def test_publisher_quantizes_and_samplers_patch_bit_exactly():
    moved = run(memory_url(), 6, "cpu", PublisherConfig(sampler_format="fp8-block", anchor_every=4))
    assert sum(moved) > 0  # blocks whose largest weight moved: their scale and values rewritten


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_publisher_and_gpu_sampler():
    """Quantized by the kernel on the trainer's GPU, encoded there, patched into float8
    tensors on the sampler's GPU: the same bytes as torch's quantization on the CPU."""
    config = PublisherConfig(sampler_format="fp8-block", anchor_every=4, baseline_device="cuda")
    assert sum(run(memory_url(), 6, "cuda", config)) > 0


def test_trainer_tensors_never_reach_the_store(tmp_path: Path):
    """The anchor holds the sampler's tensors alone: float8 weights and their scales."""
    url = f"file://{tmp_path}"
    run(url, 2, "cpu", PublisherConfig(sampler_format="fp8-block"))
    (anchor,) = tmp_path.rglob("snapshot-*.pack")
    stored = decode_snapshot(anchor.read_bytes())
    assert {k: (tuple(t.shape), t.dtype) for k, t in stored.items()} == FMT.layout(expected(0))
    assert same(stored, quantized(expected(0)))


def test_non_finite_weight_refused_before_publishing():
    url = memory_url()
    bad = dict(expected(1))
    up = "model.layers.0.mlp.up_proj.weight"
    bad[up] = bad[up].clone()
    bad[up][40, 3] = float("inf")
    with Publisher(url, PublisherConfig(sampler_format="fp8-block")) as pub:
        pub.publish(expected(0), 0).wait(30)
        with pytest.raises(QuantizationError, match=r"up_proj.weight.*rows 0\.\. and columns 0\.\."):
            pub.publish(bad, 1)
        assert pub.publish(expected(1)).wait(30).version == 1  # the refused version was never taken


def test_cli_publish_and_pull_a_block_fp8_checkpoint(tmp_path: Path):
    from safetensors.torch import load_file, save_file

    from test_checkpoint_files import tiny_checkpoint

    url, ckpt, out = f"file://{tmp_path}/store", tmp_path / "ckpt", tmp_path / "out"
    for seed in (1, 2):  # an anchor, then a delta against the quantized version in the store
        state = tiny_checkpoint(ckpt, seed=seed)
        save_file(state, str(ckpt / "model.safetensors"))
        assert main(["publish", str(ckpt), "--to", url, "--sampler-format", "fp8-block"]) == 0
    assert main(["pull", url, "--out", str(out)]) == 0
    pulled = load_file(str(out / "model.safetensors"))
    assert same(pulled, quantized(state))
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
    assert config["quantization_config"]["quant_method"] == "fp8"
