"""Event bitmaps: one bit per (class, rank) slot of a chunk, and their popcount prefix."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout
from weight_teleport.codec.cuda.bitops import popc32

BLOCK = 1024


@triton.jit
def _set_bits_kernel(bitmap_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    bi = tl.load(idx_ptr + i, mask=m, other=0)
    bit = (tl.full([BLOCK], 1, tl.uint32) << (bi & 31).to(tl.uint32)).to(tl.int32, bitcast=True)
    tl.atomic_or(bitmap_ptr + (bi >> 5), bit, mask=m)


@triton.jit
def _popc_kernel(bitmap_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    w = tl.load(bitmap_ptr + i, mask=m, other=0).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + i, popc32(w).to(tl.int32, bitcast=True), mask=m)


def build(n_words: int, bit_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bitmap of `n_words` int32 words with the bits `bit_index` set, exclusive prefix of
    the words' popcounts). Bit indices must be in range and distinct."""
    layout.require(bit_index, torch.int64)
    bitmap = torch.zeros(max(n_words, 1), dtype=torch.int32, device=bit_index.device)
    n = bit_index.numel()
    if n:
        _set_bits_kernel[(triton.cdiv(n, BLOCK),)](bitmap, bit_index, n, BLOCK=BLOCK)
    counts = torch.empty_like(bitmap)
    _popc_kernel[(triton.cdiv(bitmap.numel(), BLOCK),)](bitmap, counts, bitmap.numel(), BLOCK=BLOCK)
    return bitmap, counts.cumsum(0, dtype=torch.int32) - counts
