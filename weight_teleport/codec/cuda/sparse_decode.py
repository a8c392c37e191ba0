"""Sparse chunks on the sampler: place decoded events on the live weights, on the GPU.

Each element finds its class (old value's exponent) and class rank, looks its rank up in
its class's event bitmap, and, when changed, takes residual number (events before it, or
non-events before it in an inverted class) of its class. It writes its position and new
bit pattern to that residual's slot, so the outputs are ordered by class, then rank. The
same pass sums the digest terms of the old and of the patched words."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout, ranks
from weight_teleport.codec.cuda.bitops import key, popc32, to_bits, unkey, word_terms, wrap


@triton.jit
def _decode_kernel(old_ptr, lut_ptr, inv_ptr, base_ptr, seg_ptr, bitmap_ptr, pref_ptr, roff_ptr, res_ptr,
                   pos_ptr, val_ptr, sums_ptr, numel, chunk_elems, bpc,
                   MANT: tl.constexpr, KMASK: tl.constexpr, BITS: tl.constexpr, IS_FLOAT: tl.constexpr,
                   NCP: tl.constexpr, N_LANES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    k, first, stop, offs, valid = ranks.chunk_block(pid, numel, chunk_elems, bpc, BLOCK)
    b = to_bits(tl.load(old_ptr + offs, mask=valid, other=0), BITS)
    cls = ranks.classes(b, lut_ptr, MANT, KMASK)
    r = tl.load(base_ptr + pid * NCP + cls) + ranks.class_ranks(cls, valid, N_LANES, BLOCK)
    seg = tl.load(seg_ptr + k * NCP + cls)
    wi = seg + (r >> 5)
    word = tl.load(bitmap_ptr + wi, mask=valid, other=0).to(tl.uint32, bitcast=True)
    bit = (r & 31).to(tl.uint32)
    below = popc32(word & ((tl.full([BLOCK], 1, tl.uint32) << bit) - 1)).to(tl.int32)
    before = tl.load(pref_ptr + wi, mask=valid, other=0) - tl.load(pref_ptr + seg, mask=valid, other=0) + below
    inv = tl.load(inv_ptr + cls) != 0
    changed = valid & ((((word >> bit) & 1) != 0) != inv)
    slot = tl.load(roff_ptr + k * NCP + cls) + tl.where(inv, r - before, before)
    d = tl.load(res_ptr + slot, mask=changed, other=0).to(tl.uint64, bitcast=True)
    nb = unkey(wrap(key(b, IS_FLOAT, BITS) + d, BITS), IS_FLOAT, BITS)
    tl.store(pos_ptr + slot, offs, mask=changed)
    tl.store(val_ptr + slot, nb.to(tl.int64, bitcast=True).to(val_ptr.dtype.element_ty), mask=changed)
    word0 = first // (64 // BITS)
    s_old = word_terms(b, first, stop, word0, BLOCK, BITS)
    s_new = word_terms(tl.where(changed, nb, b), first, stop, word0, BLOCK, BITS)
    tl.store(sums_ptr + pid * 2, s_old.to(tl.int64, bitcast=True))
    tl.store(sums_ptr + pid * 2 + 1, s_new.to(tl.int64, bitcast=True))


def decode(old, lut, inverted, base, seg_word, bitmap, pref, res_off, res, n_changed: int, info,
           chunk_elems: int):
    """(positions int64, new bit patterns, [old, new] digest word sums as device int64) of a
    sparse tensor. Tables are per (chunk, class) [chunks, NCP] int64; `base` per block."""
    for t, dt in ((old, info.int_torch), (lut, torch.uint8), (inverted, torch.int8), (bitmap, torch.int32),
                  (pref, torch.int32), (res, torch.int64)):
        layout.require(t, dt)
    ncp = base.shape[1]
    assert base.dtype == torch.int32 and base.is_contiguous() and seg_word.shape == res_off.shape
    assert seg_word.dtype == res_off.dtype == torch.int64 and seg_word.shape[1] == ncp
    grid = base.shape[0]
    pos = torch.empty(n_changed, dtype=torch.int64, device=old.device)
    val = torch.empty(n_changed, dtype=info.int_torch, device=old.device)
    sums = torch.zeros((max(grid, 1), 2), dtype=torch.int64, device=old.device)
    if grid:
        _decode_kernel[(grid,)](
            old, lut, inverted, base, seg_word, bitmap, pref, res_off, res, pos, val, sums,
            old.numel(), chunk_elems, triton.cdiv(chunk_elems, ranks.BLOCK),
            MANT=info.mantissa_bits, KMASK=(1 << info.exponent_bits) - 1, BITS=info.bits,
            IS_FLOAT=info.is_float, NCP=ncp, N_LANES=ranks.lanes(inverted.numel()), BLOCK=ranks.BLOCK)
    return pos, val, sums.sum(0)
