"""The where-the-bits-go analysis: a pack's parts add up to the pack, and the adaptive
context costs are code lengths (no context is worse than the order-0 mask), and the row
contexts see rows that change at different rates."""

import torch

from weight_teleport.bench.bits import MASK_MODELS, RES_MODELS, context_costs, pack_breakdown
from weight_teleport.bench.row_bits import MASK_MODELS as STRUCTURE_MASK
from weight_teleport.bench.row_bits import RES_MODELS as STRUCTURE_RES
from weight_teleport.bench.row_bits import structure_costs
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


def _row_structured_versions(versions=3, seed=0):
    """A matrix whose rows change at rates a hundredfold apart, the same in every version."""
    g = torch.Generator().manual_seed(seed)
    states = [{"w": torch.randn(128, 256, generator=g).to(torch.bfloat16)}]
    rate = torch.where(torch.rand(128, 1, generator=g) < 0.5, 0.001, 0.1)
    for _ in range(versions):
        new = {"w": states[-1]["w"].clone()}
        new["w"].view(torch.int16)[torch.rand(128, 256, generator=g) < rate] += 1
        states.append(new)
    return states


def test_structure_costs_are_code_lengths_that_see_rows():
    *earlier, old, new = _row_structured_versions()
    costs = structure_costs(earlier, old, new)
    assert set(costs) == ({f"mask:{m}" for m in (*STRUCTURE_MASK, "mix", "best")} | {f"res:{m}" for m in STRUCTURE_RES})
    assert all(v > 0 for v in costs.values())
    for m in ("key+rowprev", "key+rowrate", "key>key+row"):
        assert costs[f"mask:{m}"] < 0.95 * costs["mask:key"]
    assert costs["mask:best"] <= min(v for k, v in costs.items() if k.startswith("mask:")) + 8


def test_structure_costs_without_history_see_no_earlier_change():
    _, old, new = _row_structured_versions(2)
    costs = structure_costs([], old, new)
    assert costs["mask:key+prev"] == costs["mask:key"]
