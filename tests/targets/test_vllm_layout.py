"""vLLM tensor-parallel layouts from a config: slice hints and each worker's slices, checked
against a reference sharding written the way vLLM's weight loaders shard (narrow per rank,
pad the vocabulary to 64, concatenate fused parts), on CPU and, where present, CUDA."""

from math import prod

import pytest
import torch

from weight_teleport.targets.slice_view import gather_walk, walk_view
from weight_teleport.targets.vllm_layout import UnsupportedLayoutError, slice_hints, worker_slices

CONFIG = {
    "model_type": "qwen3",
    "vocab_size": 500,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": False,
}
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
    ),
]


def checkpoint() -> dict[str, torch.Tensor]:
    """Every tensor of CONFIG's model, elements numbered so that any misplacement shows."""
    shapes = {s.name: s.shape for s in worker_slices(CONFIG, 1, 0).values()}
    out, base = {}, 0
    for name, shape in shapes.items():
        out[name] = (torch.arange(prod(shape), dtype=torch.int32) + base).view(shape)
        base += prod(shape)
    return out


def reference_shard(ckpt: dict, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Each vLLM parameter of worker `rank` as vLLM's loaders fill it."""
    c = CONFIG
    per = -(-c["vocab_size"] // 64) * 64 // tp
    kv, hd = c["num_key_value_heads"], c["head_dim"]
    out = {}
    for name, t in ckpt.items():
        if "embed_tokens" in name or "lm_head" in name:
            padded = torch.zeros(per * tp, t.shape[1], dtype=t.dtype)
            padded[: t.shape[0]] = t
            out[name] = padded.narrow(0, rank * per, per)
        elif name.endswith(("q_proj.weight", "gate_proj.weight", "up_proj.weight")):
            out[name] = t.chunk(tp)[rank]
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            out[name] = t.chunk(tp)[rank] if kv >= tp else t.view(kv, hd, -1)[rank // (tp // kv)]
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = t.chunk(tp, dim=1)[rank]
        else:
            out[name] = t
    fused = {}
    for name, t in out.items():
        for parts, into in [(("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj")]:
            for p in parts:
                if f".{p}." in name:
                    fused.setdefault(name.replace(p, into), []).append(t)
                    break
            else:
                continue
            break
        else:
            fused[name] = [t]
    return {n: torch.cat(ts).contiguous() for n, ts in fused.items()}


def box_walk(t: torch.Tensor, order: str, lo: int, hi: int) -> torch.Tensor:
    return t[lo:hi].reshape(-1) if order == "rows" else t[:, lo:hi].t().reshape(-1)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("device", DEVICES)
def test_worker_slices_match_vllm_sharding(tp, device):
    ckpt = checkpoint()
    covered = {n: torch.zeros(t.numel(), dtype=torch.int32) for n, t in ckpt.items()}
    for rank in range(tp):
        params = {n: t.to(device) for n, t in reference_shard(ckpt, tp, rank).items()}
        filled = {n: torch.zeros(t.numel(), dtype=torch.bool) for n, t in params.items()}
        for name, s in worker_slices(CONFIG, tp, rank).items():
            assert tuple(params[s.param].shape) == s.param_shape
            got = gather_walk(params[s.param], s).cpu()
            assert torch.equal(got, box_walk(ckpt[name], s.order, s.lo, s.hi)), name
            start, stop = s.walk
            assert (
                [s.local_index(p) for p in (start, stop - 1)] == [int(i) for i in _where(params[s.param], got[[0, -1]])]
                if stop > start
                else True
            )
            covered[name][start:stop] += 1
            marker = torch.zeros_like(params[s.param], dtype=torch.int32)
            walk_view(marker, s).fill_(1)
            filled[s.param] |= marker.view(-1).bool().cpu()
        vocab_rows = CONFIG["vocab_size"] - rank * params["lm_head.weight"].shape[0]
        for name, f in filled.items():  # every parameter element is some checkpoint element...
            if "embed_tokens" in name or "lm_head" in name:  # ...but vocab padding
                assert (
                    f.view(params[name].shape)[: max(vocab_rows, 0)].all()
                    and not f.view(params[name].shape)[max(vocab_rows, 0) :].any()
                )
            else:
                assert f.all(), name
    kv_copies = max(1, tp // CONFIG["num_key_value_heads"])  # ranks sharing one KV head
    for name, c in covered.items():  # how many ranks hold each element
        copies = tp if name.endswith("norm.weight") else kv_copies if ("k_proj" in name or "v_proj" in name) else 1
        assert bool((c == copies).all()), name


def _where(param: torch.Tensor, values: torch.Tensor) -> list[int]:
    flat = param.view(-1).cpu()
    return [int((flat == v).nonzero()[0]) for v in values]


def test_slice_hints_cut_at_every_slice_boundary():
    hints = slice_hints(CONFIG, [1, 2, 4])
    assert hints["model.layers.0.mlp.down_proj.weight"].order == "cols"
    assert hints["model.layers.0.mlp.gate_proj.weight"].order == "rows"
    assert hints["model.layers.0.input_layernorm.weight"].bounds == ()
    assert hints["lm_head.weight"].bounds == (128 * 64, 256 * 64, 384 * 64)  # padded 512 / 4; 500 rows
    for tp in (1, 2, 4):
        for rank in range(tp):
            for name, s in worker_slices(CONFIG, tp, rank).items():
                cuts = {0, prod(s.shape), *hints[name].bounds}
                assert set(s.walk) <= cuts, (name, tp, rank)
    assert all(b % 8 == 0 for h in hints.values() for b in h.bounds)


def test_fused_offsets_and_local_index():
    s = worker_slices(CONFIG, 2, 1)["model.layers.0.self_attn.v_proj.weight"]
    assert (s.param, s.lo, s.hi, s.dest, s.param_shape) == (
        "model.layers.0.self_attn.qkv_proj.weight",
        16,
        32,
        48,
        (64, 64),
    )
    o = worker_slices(CONFIG, 2, 1)["model.layers.0.self_attn.o_proj.weight"]
    assert o.walk == (32 * 64, 64 * 64) and o.local_index(32 * 64 + 65) == 1 * 32 + 1
    with pytest.raises(IndexError):
        o.local_index(0)


def test_unknown_models_and_unaligned_slices_are_refused():
    with pytest.raises(UnsupportedLayoutError, match="model_type"):
        worker_slices({**CONFIG, "model_type": "gpt2"}, 1, 0)
    with pytest.raises(UnsupportedLayoutError, match="multiple of 8"):
        slice_hints(
            {
                **CONFIG,
                "hidden_size": 6,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "head_dim": 2,
                "intermediate_size": 8,
            },
            [2],
        )
    with pytest.raises(UnsupportedLayoutError, match="divisible"):
        worker_slices(CONFIG, 3, 0)
