"""Event bitmaps (one bit per (class, rank) slot of a chunk, set by codec/cuda/kernels/stage_symbols.py):
the popcount prefix of their words."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.bitops import popc32

BLOCK = 4096
"""Words a program of the two passes reads."""


@triton.jit
def _popc(bitmap_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(bitmap_ptr + i, mask=i < n, other=0).to(tl.uint32, bitcast=True)
    return i, popc32(w).to(tl.int32, bitcast=True)


@triton.jit
def _sums_kernel(bitmap_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    _, c = _popc(bitmap_ptr, n, BLOCK)
    tl.store(sums_ptr + tl.program_id(0), tl.sum(c, 0))


@triton.jit
def _scan_kernel(bitmap_ptr, offs_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i, c = _popc(bitmap_ptr, n, BLOCK)
    tl.store(out_ptr + i, tl.load(offs_ptr + tl.program_id(0)) + tl.cumsum(c, 0) - c, mask=i < n)


def prefix(bitmap: torch.Tensor) -> torch.Tensor:
    """The exclusive prefix of the int32 words' popcounts (int32, wrapping past 2^31: users
    take differences within a segment). Two passes read the bitmap: the popcount of each
    program's words, then each program's own scan plus the prefix of the programs before it
    (a scan of one int32 a program between them). That is 3 bytes of traffic a bitmap byte
    against 4 for a popcount pass and an in-place scan of its output, and the pass is bound
    by that traffic."""
    memory.require(bitmap, torch.int32)
    n = bitmap.numel()
    g = triton.cdiv(max(n, 1), BLOCK)
    sums = torch.empty(g, dtype=torch.int32, device=bitmap.device)
    _sums_kernel[(g,)](bitmap, sums, n, BLOCK=BLOCK)
    offs = sums.cumsum(0, dtype=torch.int32).sub_(sums)
    out = torch.empty(n, dtype=torch.int32, device=bitmap.device)
    _scan_kernel[(g,)](bitmap, offs, out, n, BLOCK=BLOCK)
    return out
