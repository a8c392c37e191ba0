"""Sharded trainers publish the block-FP8 checkpoint without gathering: two gloo ranks each
quantize their own shards (`PublisherGroup` with `sampler_format="fp8-block"`) and publish
them, with their blocks' scales, as their part of each version; a subscriber holding the
whole FP8 checkpoint is bit-exact against the quantization of the unsharded weights. A shard
that cuts a block fails the version on every rank, naming the tensor."""

from __future__ import annotations


import torch

from helpers import bits
from services import gloo_rank, run_ranks
from weight_versions import FAST, follow
from weight_teleport import Subscriber, TorchTarget
from weight_teleport.quantize import sampler_format

RANKS, VERSIONS, WAIT_S = 2, 3, 300
SHAPES = {
    "model.layers.0.mlp.up_proj.weight": (300, 256),  # rows: rank 0 [0, 256), rank 1 [256, 300), a ragged block
    "model.layers.0.mlp.down_proj.weight": (256, 300),  # columns: [0, 128) and [128, 300)
    "model.norm.weight": (256,),  # rank 0 alone
}
SPLIT = {"model.layers.0.mlp.up_proj.weight": (0, 256), "model.layers.0.mlp.down_proj.weight": (1, 128)}


def versions() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    state = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in SHAPES.items()}
    out = [state]
    for _ in range(VERSIONS - 1):
        out.append(
            {k: (t.float() * (1 + 1e-3 * torch.randn(t.shape, generator=g))).to(t.dtype) for k, t in out[-1].items()}
        )
    return out


def shard(state: dict, rank: int, split: dict) -> tuple[dict, dict]:
    from weight_teleport.codec import TensorSlice

    local, slices = {}, {}
    for name, t in state.items():
        if name not in split:
            if rank == 0:
                local[name] = t
            continue
        dim, at = split[name]
        lo, hi = (0, at) if rank == 0 else (at, t.shape[dim])
        local[name] = t.narrow(dim, lo, hi - lo).contiguous()
        box = [(0, n) for n in t.shape]
        box[dim] = (lo, hi - lo)
        slices[name] = TensorSlice(tuple(t.shape), tuple(box))
    return local, slices


def _trainer(rank: int, port: int, url: str, split: dict, errors) -> None:
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.pipeline.errors import PublishFailed
    from weight_teleport.publish import PublisherGroup

    with gloo_rank(rank, port, RANKS, errors):
        config = PublisherConfig(anchor_every=10, threads=1, sampler_format="fp8-block")
        with PublisherGroup(url, config) as group:
            for v, state in enumerate(versions()):
                local, slices = shard(state, rank, split)
                try:
                    group.publish(local, v, slices=slices)
                except PublishFailed as exc:
                    errors.put(f"rank {rank}: failed: {exc}")
                    return


def _publish(url: str, split: dict) -> list[str]:
    codes, found = run_ranks(_trainer, RANKS, url, split, timeout=WAIT_S)
    assert codes == [0] * RANKS
    return found


def test_ranks_quantize_their_shards(tmp_path):
    url = f"file://{tmp_path}"
    assert _publish(url, SPLIT) == []
    fmt = sampler_format("fp8-block")
    want = versions()[-1]
    expected = {k: torch.empty(s, dtype=dt) for k, (s, dt) in fmt.layout(want).items()}
    fmt.quantize(want, expected)
    live = {k: torch.zeros_like(t) for k, t in expected.items()}
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        follow(sub, VERSIONS - 1, timeout=120)
    assert all(torch.equal(bits(live[k]), bits(t)) for k, t in expected.items())


def test_a_shard_that_cuts_a_block_fails_the_version(tmp_path):
    split = {**SPLIT, "model.layers.0.mlp.down_proj.weight": (1, 100)}
    found = _publish(f"file://{tmp_path}", split)
    assert len(found) == RANKS and all("failed" in f for f in found), found
    assert any("down_proj.weight" in f and "128-element blocks" in f for f in found), found
