"""Block-wise FP8 (`fp8-block`), the format of DeepSeek-V3's and Qwen3-*-FP8's checkpoints:
a linear layer's weight `W` [N, K] becomes `X.weight`, float8_e4m3fn [N, K], and
`X.weight_scale_inv`, float32 [ceil(N/128), ceil(K/128)], with `W ~= q * s` per block of
128 x 128 elements (ragged at the right and bottom edges).

Every value is fixed to the bit (docs/FORMAT.md, "Block FP8"), so a reader can reproduce
it and the trainer's GPU and CPU give the same bytes. Per block, in float32:

    a = max |w| over the block's elements       (exact; a NaN or Inf refuses the tensor)
    a = max(a, 2^-64)                            (an all-zero block stays finite)
    r = 448 / a                                  (IEEE division, round to nearest even)
    q = e4m3fn(clamp(w * r, -448, 448))          (one IEEE product, round to nearest even)
    s = a / 448                                  (IEEE division)

`448 / a` is a division: torch's `scalar / tensor` is a reciprocal and a product (two
roundings), and Triton's `/` is approximate, so both sides spell the division out."""

from __future__ import annotations

import torch

from weight_teleport.errors import QuantizationError
from weight_teleport.quantize.names import BLOCK

FP8_MAX = 448.0
"""The largest finite float8_e4m3fn."""
AMAX_FLOOR = 2.0**-64
"""The least block maximum: 448 / a stays finite and an all-zero block quantizes to zeros."""


def scale_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The shape of a weight's `weight_scale_inv`."""
    n, k = shape
    return -(-n // BLOCK), -(-k // BLOCK)


def _blocks(w: torch.Tensor) -> torch.Tensor:
    """`w` in float32, padded with zeros to whole blocks, viewed [nb, BLOCK, kb, BLOCK]."""
    n, k = w.shape
    nb, kb = scale_shape((n, k))
    x = torch.zeros(nb * BLOCK, kb * BLOCK, dtype=torch.float32, device=w.device)
    x[:n, :k] = w
    return x.view(nb, BLOCK, kb, BLOCK)


def _checked_amax(name: str, blocks: torch.Tensor) -> torch.Tensor:
    """Each block's largest magnitude; QuantizationError for a block holding NaN or Inf."""
    a = blocks.abs().amax(dim=(1, 3))  # NaN propagates through torch's amax
    bad = (~torch.isfinite(a)).nonzero()
    if len(bad):
        bn, bk = (int(i) for i in bad[0])
        raise QuantizationError(
            f"tensor {name!r} holds NaN or Inf in its block of rows {bn * BLOCK}.. and columns {bk * BLOCK}.. "
            f"({len(bad)} such block(s)): it cannot be quantized to fp8-block; nothing was published"
        )
    return a


def check_finite(name: str, w: torch.Tensor) -> None:
    """Raise QuantizationError, naming the first block, if `w` holds NaN or Inf."""
    _checked_amax(name, _blocks(w))


def quantize_reference(name: str, w: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """Quantize the 2-D float tensor `w` into `q` (float8_e4m3fn, w's shape) and `s`
    (float32, `scale_shape`) with torch operations, on w's device (any device; the
    CUDA kernel `kernels.quantize_into` gives the same bytes faster). Raises
    QuantizationError, writing nothing, for a block holding NaN or Inf."""
    n, k = w.shape
    blocks = _blocks(w)
    a = _checked_amax(name, blocks).clamp(min=AMAX_FLOOR)
    r = torch.full_like(a, FP8_MAX) / a
    scaled = (blocks * r[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q.copy_(scaled.view(blocks.shape[0] * BLOCK, -1)[:n, :k].to(torch.float8_e4m3fn))
    s.copy_(a / torch.full_like(a, FP8_MAX))


def dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The float32 weight `q * s` that a block-FP8 checkpoint stands for (tests, checks)."""
    n, k = q.shape
    full = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]
    return q.float() * full
