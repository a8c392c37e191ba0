"""The where-the-bits-go analysis: a pack's parts add up to the pack, and the adaptive
context costs are code lengths (no context is worse than the order-0 mask)."""

import torch

from weight_teleport.bench.bits import MASK_MODELS, RES_MODELS, context_costs, pack_breakdown
from weight_teleport.codec import encode_delta


def _step(old, seed):
    """`old` with about 2% of the matrix moved by one ULP."""
    g = torch.Generator().manual_seed(seed)
    new = {k: v.clone() for k, v in old.items()}
    new["w"].view(torch.int16)[torch.rand(64, 256, generator=g) < 0.02] += 1
    return new


def _states(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = {"w": torch.randn(64, 256, generator=g).to(torch.bfloat16), "n": torch.ones(256, dtype=torch.bfloat16)}
    return old, _step(old, seed + 1)


def test_pack_breakdown_adds_up_to_the_pack():
    old, new = _states()
    pack = encode_delta(old, new, base_version=0, version=1)
    parts = pack_breakdown(pack)
    stored = sum(v for k, v in parts.items() if not k.endswith((" h0", " streams")))
    assert stored == len(pack)
    assert parts["event symbols streams"] >= 1


def test_context_costs_are_code_lengths():
    prev, old = _states(1)
    new = _step(old, 3)
    costs = context_costs(prev, old, new)
    assert set(costs) == {f"mask:{m}" for m in MASK_MODELS} | {f"res:{m}" for m in RES_MODELS}
    assert all(v > 0 for v in costs.values())
    assert costs["mask:key"] < costs["mask:key+row"]
