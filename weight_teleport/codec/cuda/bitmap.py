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
    tl.store(out_ptr + i, popc32(w).to(tl.int32, bitcast=True), mask=m)


def prefix(bitmap: torch.Tensor) -> torch.Tensor:
    """The exclusive prefix of the int32 words' popcounts (int32)."""
    layout.require(bitmap, torch.int32)
    counts = torch.empty_like(bitmap)
    _popc_kernel[(triton.cdiv(bitmap.numel(), BLOCK),)](bitmap, counts, bitmap.numel(), BLOCK=BLOCK)
    return counts.cumsum(0, dtype=torch.int32) - counts
