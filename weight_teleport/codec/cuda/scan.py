"""The trainer's first pass: context-key histograms (all and changed elements) and the
digest word sums of the old and new tensor, fused in one read of both."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout
from weight_teleport.codec.cuda.bitops import to_bits, word_terms
from weight_teleport.codec.cuda.ranks import pow2

BLOCK = 2048
TILES = 8


@triton.jit
def _scan_kernel(old_ptr, new_ptr, hist_ptr, sums_ptr, numel, NK: tl.constexpr, NB: tl.constexpr,
                 MANT: tl.constexpr, KMASK: tl.constexpr, BITS: tl.constexpr,
                 BLOCK: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    hist = tl.zeros([NB], tl.int32)
    s_old = tl.zeros((), tl.uint64)
    s_new = tl.zeros((), tl.uint64)
    for t in tl.static_range(TILES):
        first = (pid * TILES + t) * BLOCK
        offs = first + tl.arange(0, BLOCK).to(tl.int64)
        valid = offs < numel
        o = to_bits(tl.load(old_ptr + offs, mask=valid, other=0), BITS)
        n = to_bits(tl.load(new_ptr + offs, mask=valid, other=0), BITS)
        bins = ((o >> MANT) & KMASK).to(tl.int32) + (o != n).to(tl.int32) * NK
        hist += tl.histogram(bins, NB, mask=valid)
        s_old += word_terms(o, first, numel, first // (64 // BITS), BLOCK, BITS)
        s_new += word_terms(n, first, numel, first // (64 // BITS), BLOCK, BITS)
    tl.store(hist_ptr + pid * NB + tl.arange(0, NB), hist)
    tl.store(sums_ptr + pid * 2, s_old.to(tl.int64, bitcast=True))
    tl.store(sums_ptr + pid * 2 + 1, s_new.to(tl.int64, bitcast=True))


def scan(old: torch.Tensor, new: torch.Tensor, info) -> torch.Tensor:
    """One device int64 vector: per context key the element count, then per key the changed
    count (n_keys each), then the old and the new digest word sums. No synchronisation."""
    layout.require(old, info.int_torch)
    layout.require(new, info.int_torch)
    assert old.numel() == new.numel()
    nk = 1 << info.exponent_bits
    nb = pow2(2 * nk)
    grid = max(1, triton.cdiv(old.numel(), BLOCK * TILES))
    hist = torch.zeros((grid, nb), dtype=torch.int32, device=old.device)
    sums = torch.zeros((grid, 2), dtype=torch.int64, device=old.device)
    if old.numel():
        _scan_kernel[(grid,)](old, new, hist, sums, old.numel(), NK=nk, NB=nb, MANT=info.mantissa_bits,
                              KMASK=nk - 1, BITS=info.bits, BLOCK=BLOCK, TILES=TILES)
    h = hist.sum(0, dtype=torch.int64)
    changed = h[nk:2 * nk]
    return torch.cat([h[:nk] + changed, changed, sums.sum(0)])
