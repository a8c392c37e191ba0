"""Sparse chunks on the trainer: per class, the ranks of its events and the residuals of
its changed elements, written on the GPU in the order the CPU's gap streams use."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout, ranks
from weight_teleport.codec.cuda.bitops import key, to_bits, wrap


@triton.jit
def _events_kernel(old_ptr, new_ptr, lut_ptr, inv_ptr, rbase_ptr, ebase_ptr, eoff_ptr, roff_ptr,
                   ranks_ptr, res_ptr, numel, chunk_elems, bpc,
                   MANT: tl.constexpr, KMASK: tl.constexpr, BITS: tl.constexpr, IS_FLOAT: tl.constexpr,
                   NCP: tl.constexpr, N_LANES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    k, first, stop, offs, valid = ranks.chunk_block(pid, numel, chunk_elems, bpc, BLOCK)
    o = to_bits(tl.load(old_ptr + offs, mask=valid, other=0), BITS)
    n = to_bits(tl.load(new_ptr + offs, mask=valid, other=0), BITS)
    cls = ranks.classes(o, lut_ptr, MANT, KMASK)
    inv = tl.load(inv_ptr + cls) != 0
    changed = valid & (o != n)
    ev = valid & (changed != inv)
    r = tl.load(rbase_ptr + pid * NCP + cls) + ranks.class_ranks(cls, valid, N_LANES, BLOCK)
    e = tl.load(ebase_ptr + pid * NCP + cls) + ranks.class_ranks(cls, ev, N_LANES, BLOCK)
    tl.store(ranks_ptr + tl.load(eoff_ptr + k * NCP + cls) + e, r, mask=ev)
    res = wrap(key(n, IS_FLOAT, BITS) - key(o, IS_FLOAT, BITS), BITS)
    slot = tl.load(roff_ptr + k * NCP + cls) + tl.where(inv, r - e, e)
    tl.store(res_ptr + slot, res.to(tl.int64, bitcast=True), mask=changed)


def events(old, new, lut, inverted, rbase, ebase, ev_off, res_off, n_events: int, n_changed: int, info,
           chunk_elems: int):
    """(event ranks int32, residuals int64) of a sparse tensor, each grouped by chunk then
    class at the [chunks, NCP] offsets `ev_off` / `res_off`."""
    for t, dt in ((old, info.int_torch), (new, info.int_torch), (lut, torch.uint8), (inverted, torch.int8)):
        layout.require(t, dt)
    assert rbase.shape == ebase.shape and rbase.dtype == ebase.dtype == torch.int32
    assert ev_off.dtype == res_off.dtype == torch.int64 and ev_off.shape[1] == rbase.shape[1]
    out_ranks = torch.empty(n_events, dtype=torch.int32, device=old.device)
    out_res = torch.empty(n_changed, dtype=torch.int64, device=old.device)
    if rbase.shape[0]:
        _events_kernel[(rbase.shape[0],)](
            old, new, lut, inverted, rbase, ebase, ev_off, res_off, out_ranks, out_res,
            old.numel(), chunk_elems, triton.cdiv(chunk_elems, ranks.BLOCK),
            MANT=info.mantissa_bits, KMASK=(1 << info.exponent_bits) - 1, BITS=info.bits,
            IS_FLOAT=info.is_float, NCP=rbase.shape[1], N_LANES=ranks.lanes(inverted.numel()),
            BLOCK=ranks.BLOCK)
    return out_ranks, out_res
