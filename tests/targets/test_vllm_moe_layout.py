"""vLLM's fused-MoE layouts from a config (Qwen3-MoE, Qwen2-MoE with a shared expert,
Mixtral), at TP 1/2/4/8 with expert parallelism off and on: each worker's slices checked
against a reference sharding written the way vLLM 0.32's loaders fill its parameters
(`RoutedExperts._load_w13` / `_load_w2`: per expert, the gate rows then the up rows of the
rank's intermediate block in w13_weight [E_local, 2 * I / tp, H], the down columns in
w2_weight [E_local, H, I / tp]; under expert parallelism whole experts, linearly placed,
`determine_expert_map`), with shapes computed here from the config alone. Then two ranks
stage chained versions of a tiny MoE state from a real Publisher's packs, from their own
slices alone, with TP and with EP, bit-exact."""

from math import prod

import pytest
import torch

from helpers import bits
from test_slice_stage import _mutate
from weight_teleport.format.manifest import from_json
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.store import open_store
from weight_teleport.targets.slice_stage import apply_steps, stage_entry
from weight_teleport.targets.slice_view import box_view, gather_walk, walk_view
from weight_teleport.targets.vllm_layout import UnsupportedLayoutError, slice_hints, worker_slices

BASE = {
    "vocab_size": 200,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "tie_word_embeddings": False,
}
CONFIGS = {
    "qwen3_moe": {
        **BASE,
        "model_type": "qwen3_moe",
        "num_experts": 8,
        "moe_intermediate_size": 64,
        "intermediate_size": 128,
        "mlp_only_layers": [1],
        "num_experts_per_tok": 2,
    },
    "qwen3_moe_6": {
        **BASE,
        "model_type": "qwen3_moe",
        "num_local_experts": 6,
        "moe_intermediate_size": 64,
        "intermediate_size": 128,
        "num_experts_per_tok": 2,
    },
    "qwen2_moe": {
        **BASE,
        "model_type": "qwen2_moe",
        "num_experts": 8,
        "moe_intermediate_size": 64,
        "intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "num_experts_per_tok": 2,
    },
    "mixtral": {
        **BASE,
        "model_type": "mixtral",
        "num_local_experts": 8,
        "intermediate_size": 64,
        "num_experts_per_tok": 2,
    },
}


def experts_of(c: dict) -> int:
    return c.get("num_experts") or c["num_local_experts"]  # transformers 5 writes Qwen3-MoE's as the latter


def moe_layers(c: dict) -> list[int]:
    return [i for i in range(c["num_hidden_layers"]) if i not in c.get("mlp_only_layers", [])]


def names(c: dict) -> tuple[str, tuple[str, str, str], int]:
    """(block, (gate, up, down) checkpoint names, expert intermediate size)."""
    if c["model_type"] == "mixtral":
        return "block_sparse_moe", ("w1", "w3", "w2"), c["intermediate_size"]
    return "mlp", ("gate_proj", "up_proj", "down_proj"), c["moe_intermediate_size"]


def owners(experts: int, tp: int, ep: bool) -> list[list[int]]:
    """The experts of each rank: all under TP; under EP contiguous runs, the first
    experts % tp ranks one longer."""
    if not ep or tp == 1:
        return [list(range(experts))] * tp
    counts = [experts // tp + (r < experts % tp) for r in range(tp)]
    starts = [sum(counts[:r]) for r in range(tp)]
    return [list(range(s, s + n)) for s, n in zip(starts, counts)]


def checkpoint(c: dict) -> dict[str, torch.Tensor]:
    """Every tensor of the model (the layout's names and shapes at TP=1, checked below
    against the config), elements numbered so that any misplacement shows."""
    shapes = {s.name: s.shape for s in worker_slices(c, 1, 0).values()}
    out, base = {}, 0
    for name, shape in shapes.items():
        out[name] = (torch.arange(prod(shape), dtype=torch.int32) + base).view(shape)
        base += prod(shape)
    return out


def reference_experts(c: dict, ckpt: dict, tp: int, rank: int, ep: bool) -> dict[str, torch.Tensor]:
    """The stacked expert parameters of worker `rank`, as vLLM's loaders fill them."""
    block, (gate, up, down), inter = names(c)
    mine = owners(experts_of(c), tp, ep)[rank]
    per = inter if ep else inter // tp
    lo = 0 if ep else rank * per
    out = {}
    for i in moe_layers(c):
        p = f"model.layers.{i}.{block}.experts"
        w13 = torch.stack(
            [
                torch.cat(
                    [ckpt[f"{p}.{e}.{gate}.weight"].narrow(0, lo, per), ckpt[f"{p}.{e}.{up}.weight"].narrow(0, lo, per)]
                )
                for e in mine
            ]
        )
        w2 = torch.stack([ckpt[f"{p}.{e}.{down}.weight"].narrow(1, lo, per) for e in mine])
        out[f"{p}.routed_experts.w13_weight"], out[f"{p}.routed_experts.w2_weight"] = w13.contiguous(), w2.contiguous()
    return out


def box_walk(t: torch.Tensor, order: str, lo: int, hi: int) -> torch.Tensor:
    return t[lo:hi].reshape(-1) if order == "rows" else t[:, lo:hi].t().reshape(-1)


CASES = [
    (family, tp, ep)
    for family in CONFIGS
    for tp in (1, 2, 4, 8)
    for ep in (False, True)
    if tp <= experts_of(CONFIGS[family])
]


@pytest.mark.parametrize("family,tp,ep", CASES)
def test_moe_slices_match_vllm_sharding(family, tp, ep):
    c = CONFIGS[family]
    block, (gate, up, down), inter = names(c)
    h, experts = c["hidden_size"], experts_of(c)
    ckpt = checkpoint(c)
    for i in moe_layers(c):  # the checkpoint's MoE tensors, from the config alone
        p = f"model.layers.{i}.{block}"
        assert ckpt[f"{p}.gate.weight"].shape == (experts, h)
        for e in range(experts):
            assert (
                ckpt[f"{p}.experts.{e}.{gate}.weight"].shape == ckpt[f"{p}.experts.{e}.{up}.weight"].shape == (inter, h)
            )
            assert ckpt[f"{p}.experts.{e}.{down}.weight"].shape == (h, inter)
    covered = {n: torch.zeros(t.numel(), dtype=torch.int32) for n, t in ckpt.items() if ".experts." in n}
    placement = owners(experts, tp, ep)
    for rank in range(tp):
        slices = worker_slices(c, tp, rank, ep)
        assert set(slices) | set(slices.absent) == set(ckpt) and not set(slices) & set(slices.absent)
        assert {n.split(".experts.")[1].split(".")[0] for n in slices if ".experts." in n} == {
            str(e) for e in placement[rank]
        }
        params = reference_experts(c, ckpt, tp, rank, ep)
        local, per = len(placement[rank]), inter if ep else inter // tp
        for i in moe_layers(c):
            p = f"model.layers.{i}.{block}.experts.routed_experts"
            assert params[f"{p}.w13_weight"].shape == (local, 2 * per, h)
            assert params[f"{p}.w2_weight"].shape == (local, h, per)
        filled = {n: torch.zeros(t.numel(), dtype=torch.int32) for n, t in params.items()}
        for name, s in slices.items():
            if s.expert is None:
                assert ".experts." not in name
                continue
            param = params[s.param]
            assert tuple(param.shape) == s.param_shape and s.expert < local
            got = gather_walk(param, s)
            assert torch.equal(got, box_walk(ckpt[name], s.order, s.lo, s.hi)), name
            start, stop = s.walk
            for position in (start, stop - 1, (start + stop) // 2):
                assert int(param.view(-1)[s.local_index(position)]) == int(got[position - start])
            assert torch.equal(
                box_view(param, s), ckpt[name][s.lo : s.hi] if s.order == "rows" else ckpt[name][:, s.lo : s.hi]
            )
            covered[name][start:stop] += 1
            marker = torch.zeros_like(param)
            walk_view(marker, s).fill_(1)
            filled[s.param] += marker.view(-1)
        for name, f in filled.items():  # every element of a stacked parameter holds one checkpoint element
            assert bool((f == 1).all()), name
    for name, n in covered.items():  # each element of an expert lies on exactly one rank
        assert bool((n == 1).all()), name


def test_shared_expert_and_router_stay_tensor_parallel_under_ep():
    c = CONFIGS["qwen2_moe"]
    s = worker_slices(c, 2, 1, expert_parallel=True)
    shared = s["model.layers.0.mlp.shared_expert.up_proj.weight"]
    assert (shared.param, shared.lo, shared.hi, shared.dest, shared.param_shape, shared.expert) == (
        "model.layers.0.mlp.shared_expert.gate_up_proj.weight",
        64,
        128,
        64,
        (128, 64),
        None,
    )
    router = s["model.layers.0.mlp.gate.weight"]
    assert (router.lo, router.hi, router.param_shape) == (0, 8, (8, 64))
    assert s["model.layers.0.mlp.shared_expert_gate.weight"].shape == (1, 64)
    assert s["model.layers.0.self_attn.q_proj.weight"].param_shape == (32 + 8 + 8, 64)  # qkv, TP=2
    assert s["model.layers.0.self_attn.q_proj.bias"].param == "model.layers.0.self_attn.qkv_proj.bias"
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in s.absent
    up = s["model.layers.1.mlp.experts.5.up_proj.weight"]  # rank 1 holds experts 4..7 whole
    assert (up.expert, up.lo, up.hi, up.dest, up.param_shape) == (1, 0, 64, 64, (4, 128, 64))


def test_moe_slice_hints_give_each_rank_its_share():
    c = CONFIGS["qwen3_moe"]
    hints = slice_hints(c, [1, 2, 4, 8], expert_parallel=(False, True))
    g = hints["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert g.order == "rows" and g.bounds == tuple(r * 8 * 64 for r in range(1, 8))
    assert hints["model.layers.0.mlp.experts.3.down_proj.weight"].order == "cols"
    assert hints["model.layers.0.mlp.gate.weight"].bounds == ()
    assert slice_hints(c, [2, 4], expert_parallel=True)["model.layers.0.mlp.experts.3.up_proj.weight"].bounds == ()
    for tp in (2, 4, 8):
        for ep in (False, True):
            for rank in range(tp):
                for name, s in worker_slices(c, tp, rank, ep).items():
                    assert set(s.walk) <= {0, prod(s.shape), *hints[name].bounds}, (name, tp, rank)
            experts = sum(prod(s.shape) for s in worker_slices(c, 1, 0).values() if s.expert is not None)
            for rank in range(tp):  # exactly its share of the experts' elements, with or without EP
                slices = worker_slices(c, tp, rank, ep)
                assert sum(s.walk[1] - s.walk[0] for s in slices.values() if s.expert is not None) * tp == experts


def test_unknown_models_and_unmappable_moe_are_refused():
    with pytest.raises(UnsupportedLayoutError, match="deepseek_v2"):
        worker_slices({**CONFIGS["qwen3_moe"], "model_type": "deepseek_v2"}, 1, 0)
    with pytest.raises(UnsupportedLayoutError, match="exceeds the 6 experts"):
        worker_slices(CONFIGS["qwen3_moe_6"], 8, 0)
    with pytest.raises(UnsupportedLayoutError, match="moe_intermediate_size"):
        worker_slices({**CONFIGS["qwen3_moe"], "moe_intermediate_size": 60}, 8, 0)


# Worker-local staging of a tiny MoE state, two ranks, TP and EP.

STAGE = {**CONFIGS["qwen3_moe"], "mlp_only_layers": []}


def engine_params(state: dict, slices) -> dict[str, torch.Tensor]:
    """What a vLLM worker's loader makes of checkpoint `state`: its own parameters."""
    params = {}
    for s in slices.values():
        params.setdefault(s.param, torch.zeros(s.param_shape, dtype=torch.bfloat16))
    for name, s in slices.items():
        box_view(params[s.param], s).copy_(
            state[name][s.lo : s.hi] if s.order == "rows" else state[name][:, s.lo : s.hi]
        )
    return params


@pytest.mark.parametrize("ep", [False, True])
def test_two_ranks_stage_their_experts_of_chained_versions(tmp_path, ep):
    """Each rank stages its slices of an anchor and three deltas (every expert moves, routed
    or not), chained ahead of applying, and fetches about its share of each pack."""
    gen = torch.Generator().manual_seed(0)
    url = f"file://{tmp_path}"
    shapes = {s.name: s.shape for s in worker_slices(STAGE, 1, 0).values()}
    states = [{n: torch.randn(shape, generator=gen).to(torch.bfloat16) for n, shape in shapes.items()}]
    for density in (0.02, 0.2, 0.01):
        states.append(_mutate(states[-1], density, gen))
    with Publisher(
        url, PublisherConfig(hints=slice_hints(STAGE, [1, 2], expert_parallel=(False, True)), threads=1)
    ) as pub:
        for v, st in enumerate(states, start=1):
            pub.publish(st, version=v).wait()
    store = open_store(url)
    entries = [e for e in from_json(store.get_manifest()).entries if e.version == 1 or e.kind == "delta"]
    for rank in range(2):
        slices = worker_slices(STAGE, 2, rank, ep)
        params = engine_params({n: torch.zeros_like(t) for n, t in states[0].items()}, slices)
        steps = []
        for e in entries:
            steps.append(stage_entry(store, e, params, slices, pending=steps))
        apply_steps(params, steps)
        want = engine_params(states[-1], slices)
        assert set(params) == set(want)
        for name in want:
            assert torch.equal(bits(params[name]), bits(want[name])), (rank, name)
        for step, entry in zip(steps[1:], entries[1:]):
            assert step.fetched <= 0.6 * entry.size + (16 << 10), (rank, step.fetched, entry.size)
