"""Event bitmaps (one bit per (class, rank) slot of a chunk, set by codec/cuda/unsymbols.py):
the popcount prefix of their words."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout
from weight_teleport.codec.cuda.bitops import popc32

BLOCK = 1024


@triton.jit
def _popc_kernel(bitmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    w = tl.load(bitmap_ptr + i, mask=m, other=0).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + 1 + i, popc32(w).to(tl.int32, bitcast=True), mask=m)
    tl.store(out_ptr + i, 0, mask=i == 0)


def prefix(bitmap: torch.Tensor) -> torch.Tensor:
    """The exclusive prefix of the int32 words' popcounts (int32, wrapping past 2^31: users
    take differences within a segment). Each word's popcount is written one place on, so one
    in-place scan gives the prefix, with no pass that subtracts the counts."""
    layout.require(bitmap, torch.int32)
    n = bitmap.numel()
    out = torch.empty(n + 1, dtype=torch.int32, device=bitmap.device)
    _popc_kernel[(triton.cdiv(max(n, 1), BLOCK),)](bitmap, out, n, BLOCK=BLOCK)
    return out.cumsum_(0)[:n]
