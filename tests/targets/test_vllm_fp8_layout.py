"""vLLM's layout of a block-FP8 checkpoint (`targets.vllm_layout`, engine-free): every
linear weight's block scales in `{param}_scale_inv`, checked against shapes computed here
from the config as vLLM 0.32's `Fp8LinearMethod.create_weights` and
`BlockQuantScaleParameter` make them (fused layers stack their shards' scale rows); shards
off the 128-row grid, other quantizations and block-FP8 MoE layers refused by name; and TP=2
workers holding the FP8 parameters following a publisher that quantizes, bit-exact after
every version against the quantized checkpoint laid out as vLLM's loader lays it."""

from math import ceil

import pytest
import torch

from helpers import bits
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.quantize import sampler_format
from weight_teleport.targets.slice_view import box_view
from weight_teleport.targets.slice_stage import apply_steps, held_box
from weight_teleport.targets.vllm_layout import UnsupportedLayoutError, slice_hints, worker_slices
from weight_teleport.targets.worker_local import TeleportInitInfo, WorkerLocal

FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
QWEN3_8B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 2,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "quantization_config": FP8,
}


def expected_scale_params(c: dict, tp: int) -> dict[str, tuple[int, int]]:
    """Each layer's scale parameters on a rank, from the config: a fused layer's rows are
    the sum of its shards' local rows in blocks (vLLM: ceil(sum(output_partition_sizes) / 128)),
    a row-parallel layer's columns its local input width in blocks."""
    h, hd, inter = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q = c["num_attention_heads"] // tp * hd
    kv = max(c["num_key_value_heads"] // tp, 1) * hd
    return {
        "qkv_proj": (ceil((q + 2 * kv) / 128), ceil(h / 128)),
        "o_proj": (ceil(h / 128), ceil(c["num_attention_heads"] * hd / tp / 128)),
        "gate_up_proj": (ceil(2 * inter / tp / 128), ceil(h / 128)),
        "down_proj": (ceil(h / 128), ceil(inter / tp / 128)),
    }


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_scales_tile_vllms_parameters(tp):
    want = expected_scale_params(QWEN3_8B, tp)
    for rank in range(tp):
        slices = worker_slices(QWEN3_8B, tp, rank)
        covered: dict[str, set] = {}
        for name, s in slices.items():
            if not name.endswith("_scale_inv"):
                continue
            weight = slices[name.removesuffix("_scale_inv")]
            assert s.shape == (ceil(weight.shape[0] / 128), ceil(weight.shape[1] / 128))
            assert s.param == weight.param + "_scale_inv"
            module = s.param.split(".")[-2]
            assert s.param_shape == want[module], (name, s.param_shape, want[module])
            span = range(s.dest, s.dest + s.hi - s.lo)
            assert not covered.setdefault(s.param, set()) & set(span), f"{name} overlaps another shard"
            covered[s.param] |= set(span)
        for param, rows in covered.items():  # each parameter's scale rows (columns) filled, once
            s = next(x for x in slices.values() if x.param == param)
            assert rows == set(range(s.param_shape[0 if s.order == "rows" else 1])), param
        assert "lm_head.weight_scale_inv" not in slices and "model.embed_tokens.weight_scale_inv" not in slices
    hints = slice_hints(QWEN3_8B, [1, 2, 4, 8])
    assert hints["model.layers.0.mlp.down_proj.weight_scale_inv"].bounds == tuple(32 * 12 * i for i in range(1, 8))


def test_misaligned_shards_and_other_quantizations_refused():
    one_kv_head = {**QWEN3_8B, "num_key_value_heads": 1, "head_dim": 64, "num_attention_heads": 64}
    with pytest.raises(UnsupportedLayoutError, match=r"self_attn\.v_proj\.weight'.*place in the fused parameter"):
        worker_slices(one_kv_head, 1, 0)  # k_proj's 64 rows end off the grid, where v_proj's begin
    with pytest.raises(UnsupportedLayoutError, match=r"mlp\.up_proj\.weight'.*place in the fused parameter"):
        worker_slices({**QWEN3_8B, "intermediate_size": 12288 + 64}, 1, 0)
    with pytest.raises(UnsupportedLayoutError, match=r"mlp\.gate_proj\.weight'.*first row 6176"):
        worker_slices({**QWEN3_8B, "intermediate_size": 12288 + 64}, 2, 1)
    with pytest.raises(UnsupportedLayoutError, match="quantization 'awq'"):
        worker_slices({**QWEN3_8B, "quantization_config": {"quant_method": "awq"}}, 1, 0)
    with pytest.raises(UnsupportedLayoutError, match="weight_block_size"):
        worker_slices({**QWEN3_8B, "quantization_config": {**FP8, "weight_block_size": None}}, 1, 0)
    moe = {
        "model_type": "qwen3_moe",
        "vocab_size": 1024,
        "hidden_size": 1024,
        "moe_intermediate_size": 256,
        "num_experts": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "quantization_config": FP8,
    }
    with pytest.raises(UnsupportedLayoutError, match="fused-MoE layers of a block-FP8 model are not mapped"):
        worker_slices(moe, 1, 0)


TINY = {
    "model_type": "qwen3",
    "vocab_size": 256,
    "hidden_size": 1024,
    "intermediate_size": 1024,
    "num_hidden_layers": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "quantization_config": FP8,
}
TP = 2


def trainer_state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {n: s.shape for n, s in worker_slices({**TINY, "quantization_config": None}, 1, 0).items()}
    return {n: (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16) for n, shape in shapes.items()}


def step(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """An Adam-like step: every weight moves by about 1e-3 of its size, some blocks' largest too."""
    g = torch.Generator().manual_seed(seed)
    return {
        n: (t.float() * (1 + 1e-3 * torch.randn(t.shape, generator=g))).to(torch.bfloat16) for n, t in state.items()
    }


def engine_params(checkpoint: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """What vLLM's loader makes of the block-FP8 `checkpoint` on worker `rank`.
    The workers are two ranks of one process without a process group: each applies what it
    staged as a unanimous commit would (`WorkerLocal.commit`'s vote is the engine tests')."""
    slices = worker_slices(TINY, TP, rank)
    params: dict[str, torch.Tensor] = {}
    for name, s in slices.items():
        params.setdefault(s.param, torch.zeros(s.param_shape, dtype=checkpoint[name].dtype))
        box_view(params[s.param], s).copy_(checkpoint[name][tuple(slice(o, o + e) for o, e in held_box(s))])
    return params


def test_tp2_workers_follow_a_quantizing_publisher(tmp_path):
    fmt = sampler_format("fp8-block")

    def quantized(state):
        out = {k: torch.empty(s, dtype=dt) for k, (s, dt) in fmt.layout(state).items()}
        fmt.quantize(state, out)
        return out

    url = f"file://{tmp_path}"
    states = [trainer_state(0)]
    states += [step(states[-1], v) for v in range(1, 4)]
    config = PublisherConfig(sampler_format="fp8-block", hints=slice_hints(TINY, [TP]), threads=1)
    workers, params = [], []
    with Publisher(url, config) as pub:
        pub.publish(states[0], version=0).wait(60)
        for rank in range(TP):
            params.append(engine_params(quantized(states[0]), rank))
            assert params[rank]["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.float8_e4m3fn
            worker = WorkerLocal(
                lambda p=params[rank]: p, worker_slices(TINY, TP, rank), rank, None, torch.device("cpu")
            )
            worker.start(TeleportInitInfo(url, initial_version=0, watch_timeout_s=0.1))
            workers.append(worker)
        try:
            scales_moved = 0
            for v in range(1, len(states)):
                pub.publish(states[v], version=v).wait(60)
                for rank, w in enumerate(workers):  # what a commit of v writes: the chain the rank staged
                    entry = w.board.wait(v, 120)
                    assert entry is not None and entry.error is None, entry
                    apply_steps(params[rank], entry.patch)
                want, before = quantized(states[v]), quantized(states[v - 1])
                scales_moved += sum(int((bits(want[k]) != bits(before[k])).sum()) for k in want if "scale" in k)
                for rank in range(TP):
                    expected = engine_params(want, rank)
                    assert all(torch.equal(bits(params[rank][n]), bits(t)) for n, t in expected.items()), (v, rank)
            assert scales_moved > 0
        finally:
            for w in workers:
                w.shutdown()


def test_kernels_that_rewrite_weights_refused():
    """Workers patch only layers whose kernel reads the checkpoint's tensors as loaded."""
    from weight_teleport.targets.vllm_fp8 import refusal

    assert refusal("m.qkv_proj", True, "CutlassFp8BlockScaledMMKernel", e8m0=True) is None
    assert refusal("m.qkv_proj", True, "DeepGemmFp8BlockScaledMMKernel", e8m0=False) is None
    assert "VLLM_USE_DEEP_GEMM_E8M0=0" in refusal("m.qkv_proj", True, "DeepGemmFp8BlockScaledMMKernel", e8m0=True)
    assert "repacks" in refusal("m.o_proj", True, "CPUFp8BlockScaledMMKernel", e8m0=False)
    assert "per-tensor" in refusal("m.o_proj", False, "CutlassFP8ScaledMMLinearKernel", e8m0=False)
