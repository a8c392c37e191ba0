"""The block-FP8 quantizer on a CUDA device: one program per 128 x 128 block reads the
block's weights once, and writes its float8 values and its scale (the formula of
`quantize.fp8`, to the bit) and whether it held NaN or Inf."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weight_teleport.quantize.fp8 import AMAX_FLOOR, BLOCK, FP8_MAX, scale_shape


@triton.jit
def _e4m3_bits(y):
    """The float8_e4m3fn bit patterns of float32 `y` (finite, |y| <= 448), rounded to
    nearest even, in integer and exact float32 steps (the same bits in Triton's interpreter,
    whose own float8 cast loses a rounding's carry into the exponent)."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # normal (|y| >= 2^-6): keep 3 mantissa bits, rounding to even; a carry moves the exponent
    up = mag + 0x7FFFF + ((mag >> 20) & 1)
    normal = (up >> 20) - (120 << 3)
    # subnormal: multiples of 2^-9, rounded to even by float32's own addition (8 is 2^-6)
    k = ((tl.abs(y) * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    return (tl.where(mag >= 0x3C800000, normal, k) | sign).to(tl.uint8)


@triton.jit
def _block_fp8_kernel(
    w_ptr, q_ptr, s_ptr, bad_ptr, n, k, w_row, q_row, kb, FLOOR: tl.constexpr, MAX: tl.constexpr, B: tl.constexpr
):
    pid = tl.program_id(0)
    bn, bk = pid // kb, pid % kb
    rows = (bn * B + tl.arange(0, B)).to(tl.int64)
    cols = bk * B + tl.arange(0, B)
    m = (rows[:, None] < n) & (cols[None, :] < k)
    x = tl.load(w_ptr + rows[:, None] * w_row + cols[None, :], mask=m, other=0.0).to(tl.float32)
    ax = tl.abs(x)
    bad = tl.sum(((x != x) | (ax == float("inf"))).to(tl.int32))
    a = tl.maximum(tl.max(ax), FLOOR)
    r = tl.div_rn(MAX, a)
    y = tl.minimum(tl.maximum(x * r, -MAX), MAX)
    tl.store(q_ptr + rows[:, None] * q_row + cols[None, :], _e4m3_bits(y), mask=m)
    tl.store(s_ptr + pid, tl.div_rn(a, MAX))
    tl.atomic_max(bad_ptr, bad)


def quantize_into(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bad: torch.Tensor) -> None:
    """Queue the quantization of the 2-D CUDA tensor `w` (rows of unit stride) into `q`
    (float8_e4m3fn, w's shape, rows of unit stride) and the contiguous `s` (float32,
    `scale_shape`) on the current stream; the int32 scalar `bad` becomes > 0 if a block
    held NaN or Inf (the caller checks it after the stream's work, and discards q and s)."""
    n, k = w.shape
    nb, kb = scale_shape((n, k))
    if w.stride(1) != 1 or q.stride(1) != 1 or not s.is_contiguous():
        raise ValueError("quantize_into needs rows of unit stride and contiguous scales")
    if n and k:
        _block_fp8_kernel[(nb * kb,)](
            w,
            q.view(torch.uint8),
            s,
            bad,
            n,
            k,
            w.stride(0),
            q.stride(0),
            kb,
            FLOOR=AMAX_FLOOR,
            MAX=FP8_MAX,
            B=BLOCK,
            num_warps=8,
        )
