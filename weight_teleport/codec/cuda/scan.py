"""The trainer's first pass over every chunk of a batch of tensors (one element type, one
launch): context-key histograms (all and changed elements) and the digest word sums of the
old and new tensors, fused in one read of both."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import blocks, layout
from weight_teleport.codec.cuda.bitops import to_bits, word_terms
from weight_teleport.codec.cuda.ranks import pow2

BLOCK = 2048
TILES = 16
SPAN = BLOCK * TILES
"""Elements of one program (a block of the chunk table)."""


@triton.jit
def _scan_kernel(old_ptr, rows_ptr, prog_ptr, new_ptr, new_off_ptr, hist_ptr, sums_ptr, NK: tl.constexpr,
                 NB: tl.constexpr, MANT: tl.constexpr, KMASK: tl.constexpr, BITS: tl.constexpr,
                 BLOCK: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    k = tl.load(prog_ptr + pid).to(tl.int64)
    row = rows_ptr + k * 5
    off, length, start, p0 = tl.load(row + 0), tl.load(row + 1), tl.load(row + 2), tl.load(row + 4)
    first = (pid - p0) * (BLOCK * TILES)
    noff = tl.load(new_off_ptr + k)
    hist = tl.zeros([NB], tl.int32)
    s_old = tl.zeros((), tl.uint64)
    s_new = tl.zeros((), tl.uint64)
    for i in range(TILES):
        at = first + i * BLOCK
        offs = at + tl.arange(0, BLOCK).to(tl.int64)
        valid = offs < length
        o = to_bits(tl.load(old_ptr + off + offs, mask=valid, other=0), BITS)
        n = to_bits(tl.load(new_ptr + noff + offs, mask=valid, other=0), BITS)
        bins = ((o >> MANT) & KMASK).to(tl.int32) + (o != n).to(tl.int32) * NK
        hist += tl.histogram(bins, NB, mask=valid)
        word0 = (start + at) // (64 // BITS)
        s_old += word_terms(o, at, length, word0, BLOCK, BITS)
        s_new += word_terms(n, at, length, word0, BLOCK, BITS)
    tl.store(hist_ptr + pid * NB + tl.arange(0, NB), hist)
    tl.store(sums_ptr + pid * 2, s_old.to(tl.int64, bitcast=True))
    tl.store(sums_ptr + pid * 2 + 1, s_new.to(tl.int64, bitcast=True))


def _per_tensor(rows: torch.Tensor, table: blocks.ChunkTable, n_tensors: int) -> torch.Tensor:
    """Sums of the program rows of each tensor (integer atomics: exact in any order)."""
    out = torch.zeros((n_tensors, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    return out.index_add_(0, table.program_tensor, rows)


def scan(table: blocks.ChunkTable, new: blocks.Paired, n_tensors: int, info) -> torch.Tensor:
    """[tensors, 2 * n_keys + 2] device int64: per context key the element count, then per
    key the changed count, then the old and the new digest word sums, of every tensor of a
    chunk table built with block SPAN (`new` the new tensors of the same shapes). No sync."""
    layout.require(table.base, info.int_torch)
    layout.require(new.base, info.int_torch)
    assert table.block == SPAN and new.offsets.shape == (table.chunks,)
    nk = 1 << info.exponent_bits
    nb = pow2(2 * nk)
    dev = table.base.device
    hist = torch.empty((table.programs, nb), dtype=torch.int32, device=dev)
    sums = torch.empty((table.programs, 2), dtype=torch.int64, device=dev)
    if table.programs:
        _scan_kernel[(table.programs,)](table.base, table.rows, table.program_chunk, new.base, new.offsets,
                                        hist, sums, NK=nk, NB=nb, MANT=info.mantissa_bits, KMASK=nk - 1,
                                        BITS=info.bits, BLOCK=BLOCK, TILES=TILES)
    out = _per_tensor(torch.cat([hist.long(), sums], 1), table, n_tensors)
    changed = out[:, nk:2 * nk]
    return torch.cat([out[:, :nk] + changed, changed, out[:, nb:]], 1)
