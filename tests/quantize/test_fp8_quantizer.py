"""The block-FP8 quantizer (`weight_teleport.quantize`): its values fixed to the bit by
docs/FORMAT.md, checked against independently known float8_e4m3fn encodings and float32
arithmetic, and the same bytes from torch (any device) and from the Triton kernel (on a
GPU, or in Triton's interpreter without one) on random and adversarial weights."""

import hashlib
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import bits
from weight_teleport.errors import QuantizationError
from weight_teleport.quantize import fp8, sampler_format

ON_GPU = torch.cuda.is_available()
KERNEL = ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"
"""Where the Triton kernel runs here: on the GPU, or in the interpreter (CPU test runs)."""
DEVICE = "cuda" if ON_GPU else "cpu"


def reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty(fp8.scale_shape(tuple(w.shape)), device=w.device)
    fp8.quantize_reference("w", w, q, s)
    return q, s


def kernel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    from weight_teleport.quantize.kernels import quantize_into

    w = w.to(DEVICE)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=DEVICE)
    s = torch.empty(fp8.scale_shape(tuple(w.shape)), device=DEVICE)
    bad = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    quantize_into(w, q, s, bad[0])
    return q.cpu(), s.cpu(), int(bad.item())


# Known float8_e4m3fn encodings, quantized in a block whose largest magnitude is 448 (so
# r = 448 / 448 = 1 and q is the rounding alone): value -> bits.
E4M3 = [
    (448.0, 0x7E),
    (-448.0, 0xFE),
    (1.0, 0x38),
    (-1.0, 0xB8),
    (0.0, 0x00),
    (-0.0, 0x80),
    (17.0, 0x58),  # a tie between 16 and 18: to even, 16
    (19.0, 0x5A),  # a tie between 18 and 20: to even, 20
    (440.0, 0x7E),  # nearer 448 than 416
    (2.0**-6, 0x08),  # the least normal
    (2.0**-9, 0x01),  # the least subnormal
    (2.0**-10, 0x00),  # half of it: a tie, to even (zero)
    (3 * 2.0**-10, 0x02),  # 1.5 of it: a tie, to even (2)
    (7 * 2.0**-9, 0x07),  # the largest subnormal
    (15 * 2.0**-10, 0x08),  # rounds up across into the normals
    (31.5, 0x60),  # rounds up, carrying into the exponent: 32
]


def test_known_encodings():
    w = torch.tensor([v for v, _ in E4M3], dtype=torch.float32).view(1, -1)
    q, s = reference(w)
    assert bits(q).view(-1).tolist() == [b for _, b in E4M3]
    assert s.item() == 1.0


def test_scale_is_float32_division():
    """s = a / 448 and r = 448 / a, each one IEEE float32 division (numpy's float32)."""
    for a in (3.0, 0.0123, 1e-15, 7.77e20, 2.0**-64):
        w = torch.tensor([[a, -a / 3]], dtype=torch.float32)
        q, s = reference(w)
        assert s.numpy()[0, 0].tobytes() == (np.float32(a) / np.float32(448)).tobytes()
        r = np.float32(448) / np.float32(a)
        third = (np.float32(-a / 3) * r).astype(np.float32)
        assert q.float()[0, 1].item() == torch.tensor(float(third)).to(torch.float8_e4m3fn).float().item()
        assert q.float()[0, 0].item() == 448.0  # the block's largest magnitude maps to the largest fp8


def test_all_zero_block_and_floor():
    w = torch.zeros(130, 129, dtype=torch.bfloat16)
    w[129, 128] = -2.0  # one ragged corner block holds a weight
    q, s = reference(w)
    floor = (np.float32(2.0**-64) / np.float32(448)).tobytes()
    assert s.shape == (2, 2)
    for bn, bk in ((0, 0), (0, 1), (1, 0)):
        assert s.numpy()[bn, bk].tobytes() == floor
    assert s[1, 1].item() == np.float32(2.0) / np.float32(448)
    assert bits(q)[129, 128].item() == 0xFE and int(bits(q).ne(0).sum()) == 1


def test_subnormal_weights():
    """bf16 subnormal weights: a block of them is floored (its scale 2^-64 / 448, its
    values zeros); fp8 subnormals: weights far below their block's largest."""
    tiny = torch.tensor([2.0**-133, -(2.0**-130), 2.0**-127, 2.0**-70], dtype=torch.bfloat16).view(1, -1)
    q, s = reference(tiny)
    assert s.numpy()[0, 0].tobytes() == (np.float32(2.0**-64) / np.float32(448)).tobytes()
    assert bits(q).view(-1).tolist() == [0x00, 0x80, 0x00, 0x4E]  # 2^-70 * 448 / 2^-64 is 7.0
    w = torch.tensor([[448.0, 2.0**-8, 2.0**-11, 5 * 2.0**-11]], dtype=torch.float32)
    assert bits(reference(w)[0]).view(-1).tolist() == [0x7E, 0x02, 0x00, 0x01]


@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_refused(special):
    w = torch.randn(200, 300) * 0.02
    w[150, 260] = special
    with pytest.raises(QuantizationError, match=r"rows 128\.\. and columns 256\.\."):
        reference(w)


def test_golden_bytes():
    """The bytes of a seeded mixed tensor (ragged, zero, tiny and large blocks) never change."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(300, 260, generator=g) * 0.02).to(torch.bfloat16)
    w[:128, :128] = 0
    w[128:256, :128] *= 1e-20
    w[256:, 128:256] *= 1e4
    q, s = reference(w)
    digest = hashlib.sha256(bits(q).numpy().tobytes() + s.numpy().tobytes()).hexdigest()
    assert digest == GOLDEN


GOLDEN = "46df8fd54c6cacda290d3c65167808668655247eb82048249434455de55ad0e9"


def adversarial(draw_seed: int, n: int, k: int, dtype: torch.dtype, mode: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(draw_seed)
    if mode == "random-bits":  # every finite bit pattern of the dtype
        width = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
        raw = torch.randint(-(2**15), 2**15, (n, k), generator=g, dtype=torch.int32)
        if width is torch.int32:
            raw = raw * 65536 + torch.randint(0, 2**16, (n, k), generator=g, dtype=torch.int32)
        w = raw.to(width).view(dtype)
        return torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    w = torch.randn(n, k, generator=g)
    if mode == "steps":  # values near the roundings' ties, in blocks of a few magnitudes
        top = 30 if dtype != torch.float16 else 4
        w = torch.round(w * 64) / 64 * torch.logspace(-top, top, k)[None, :]
    return w.to(dtype)


@pytest.mark.skipif(not KERNEL, reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1")
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 300),
    k=st.integers(1, 300),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    mode=st.sampled_from(["normal", "random-bits", "steps"]),
)
def test_kernel_equals_reference(seed, n, k, dtype, mode):
    w = adversarial(seed, n, k, dtype, mode)
    q, s = reference(w)
    kq, ks, bad = kernel(w)
    assert bad == 0
    assert torch.equal(bits(kq), bits(q)) and torch.equal(bits(ks), bits(s))


@pytest.mark.skipif(not KERNEL, reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1")
def test_kernel_flags_non_finite_and_strided_rows():
    w = torch.randn(260, 400) * 0.02
    view = w[:, 10:270]  # rows of unit stride inside a wider tensor
    q, s = reference(view)
    kq, ks, bad = kernel(view)
    assert bad == 0 and torch.equal(bits(kq), bits(q)) and torch.equal(bits(ks), bits(s))
    w[3, 200] = float("nan")
    assert kernel(view)[2] > 0


def test_format_layout_and_names():
    fmt = sampler_format("fp8-block")
    state = {
        "model.embed_tokens.weight": torch.zeros(10, 8, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(300, 8, dtype=torch.bfloat16),
        "model.layers.0.mlp.experts.3.down_proj.weight": torch.zeros(8, 200, dtype=torch.float32),
        "model.layers.0.mlp.gate.weight": torch.zeros(4, 8, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.zeros(300, dtype=torch.bfloat16),
        "model.norm.weight": torch.zeros(8, dtype=torch.bfloat16),
        "lm_head.weight": torch.zeros(10, 8, dtype=torch.bfloat16),
    }
    layout = fmt.layout(state)
    assert layout["model.layers.0.self_attn.q_proj.weight"] == ((300, 8), torch.float8_e4m3fn)
    assert layout["model.layers.0.self_attn.q_proj.weight_scale_inv"] == ((3, 1), torch.float32)
    assert layout["model.layers.0.mlp.experts.3.down_proj.weight_scale_inv"] == ((1, 2), torch.float32)
    unchanged = [n for n in state if layout[n] == (tuple(state[n].shape), state[n].dtype)]
    assert sorted(unchanged) == sorted(
        [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.gate.weight",
            "model.layers.0.self_attn.q_proj.bias",
            "model.norm.weight",
            "lm_head.weight",
        ]
    )
    assert sampler_format(None) is None
    with pytest.raises(Exception, match="sampler_format='fp4'"):
        sampler_format("fp4")


@pytest.mark.skipif(not KERNEL, reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1")
def test_format_runs_the_kernel_per_tensor_and_names_a_refused_one():
    """`SamplerFormat`'s device path (the kernel per weight, one flag read-back per device)
    gives torch's bytes, and refuses a weight holding NaN by name and block."""
    fmt = sampler_format("fp8-block")
    g = torch.Generator().manual_seed(3)
    state = {
        "a.q_proj.weight": (torch.randn(130, 260, generator=g) * 0.02).to(torch.bfloat16).to(DEVICE),
        "a.o_proj.weight": (torch.randn(64, 128, generator=g)).to(torch.float32).to(DEVICE),
    }
    out = {k: torch.empty(s, dtype=dt, device=DEVICE) for k, (s, dt) in fmt.layout(state).items()}
    fmt._quantize_on_device(state, out)
    for name, w in state.items():
        q, s = reference(w.cpu())
        assert torch.equal(bits(out[name]).cpu(), bits(q)) and torch.equal(
            bits(out[name + "_scale_inv"]).cpu(), bits(s)
        )
    state["a.o_proj.weight"][5, 7] = float("nan")
    with pytest.raises(QuantizationError, match=r"'a\.o_proj\.weight'.*rows 0\.\. and columns 0\.\."):
        fmt._quantize_on_device(state, out)
