"""Sparse chunks on the trainer: per class, the ranks of its events and the residuals of
its changed elements, written on the GPU in the order the CPU's gap streams use, for every
chunk of a batch of tensors of one element type in one launch (the warp kernel
`class_events` of warp.cu where it runs, else the Triton kernel here)."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.kernels import chunk_table, class_ranks, warp
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.bitops import as_int64, key, narrow_bits, wrap

ROW, NUM_WARPS = 16, 2
"""Tile rows and warps of the Triton events kernel: the fastest shape tried (the pack does
not depend on it)."""
EVENT_WARPS = 2
"""Warps of a CTA of the warp events kernel (each holds two sub-blocks of both tensors in
shared memory)."""


@triton.jit
def _events_kernel(
    old_ptr,
    rows_ptr,
    prog_ptr,
    new_ptr,
    new_off_ptr,
    lut_ptr,
    inv_ptr,
    rbase_ptr,
    ebase_ptr,
    eoff_ptr,
    roff_ptr,
    ranks_ptr,
    res_ptr,
    NK: tl.constexpr,
    MANT: tl.constexpr,
    KMASK: tl.constexpr,
    BITS: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    NCP: tl.constexpr,
    N_LANES: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    k, t, off, start, length, first = class_ranks.table_block(pid, rows_ptr, prog_ptr, BLOCK)
    offs, valid = class_ranks.grid(first, length, BLOCK, ROW)
    o = narrow_bits(tl.load(old_ptr + off + offs, mask=valid, other=0), BITS)
    n = narrow_bits(tl.load(new_ptr + tl.load(new_off_ptr + k) + offs, mask=valid, other=0), BITS)
    cls = class_ranks.classes(o, lut_ptr + t * NK, MANT, KMASK)
    inv = tl.load(inv_ptr + t * NCP + cls) != 0
    changed = valid & (o != n)
    ev = valid & (changed != inv)
    r = tl.load(rbase_ptr + pid * NCP + cls) + class_ranks.class_ranks(cls, valid, N_LANES)
    e = tl.load(ebase_ptr + pid * NCP + cls) + class_ranks.class_ranks(cls, ev, N_LANES)
    tl.store(ranks_ptr + tl.load(eoff_ptr + k * NCP + cls, mask=ev, other=0) + e, r, mask=ev)
    res = wrap(key(n, IS_FLOAT, BITS) - key(o, IS_FLOAT, BITS), BITS)
    slot = tl.load(roff_ptr + k * NCP + cls, mask=changed, other=0) + tl.where(inv, r - e, e)
    tl.store(res_ptr + slot, as_int64(res, BITS).to(res_ptr.dtype.element_ty), mask=changed)


def events(
    table: chunk_table.ChunkTable,
    new: chunk_table.Paired,
    luts,
    inverted,
    rbase,
    ebase,
    ev_off,
    res_off,
    n_events: int,
    n_changed: int,
    n_classes: int,
    info,
):
    """(event ranks int32, residuals of the elements' width, `info.int_torch`) of every
    chunk of a chunk table, grouped by chunk then class at the flat [chunks * NCP] offsets
    `ev_off` / `res_off`. `rbase` / `ebase`
    are the blocks' class-rank and event-rank bases (class_ranks.table_bases); `luts` and the
    int8 `inverted` flags are per tensor; `n_classes` the most classes of any tensor."""
    memory.require(table.base, info.int_torch)
    memory.require(new.base, info.int_torch)
    ncp = rbase.shape[1]
    assert new.offsets.shape == (table.chunks,)
    assert luts.dtype == torch.uint8 and inverted.dtype == torch.int8 and inverted.shape[1] == ncp
    assert rbase.shape == ebase.shape == (table.programs, ncp) and rbase.dtype == ebase.dtype == torch.int32
    assert ev_off.dtype == res_off.dtype == torch.int64 and ev_off.numel() == res_off.numel() == table.chunks * ncp
    out_ranks = torch.empty(n_events, dtype=torch.int32, device=table.base.device)
    out_res = torch.empty(n_changed, dtype=info.int_torch, device=table.base.device)
    if table.programs and warp.available(table.base):
        warp.launch(
            "class_events",
            table,
            info,
            warp.EventParams.of(
                old=table.base,
                rows=table.rows,
                prog=table.program_chunk,
                nw=new.base,
                new_off=new.offsets,
                lut=luts,
                inv_tab=inverted,
                rbase=rbase,
                ebase=ebase,
                eoff=ev_off,
                roff=res_off,
                ranks_out=out_ranks,
                res_out=out_res,
                programs=table.programs,
            ),
            warps=EVENT_WARPS,
            NCP=ncp,
            EVENT_WARPS=EVENT_WARPS,
        )
    elif table.programs:
        assert table.block == class_ranks.BLOCK, "the Triton events kernel takes blocks of class_ranks.BLOCK"
        _events_kernel[(table.programs,)](
            old_ptr=table.base,
            rows_ptr=table.rows,
            prog_ptr=table.program_chunk,
            new_ptr=new.base,
            new_off_ptr=new.offsets,
            lut_ptr=luts,
            inv_ptr=inverted,
            rbase_ptr=rbase,
            ebase_ptr=ebase,
            eoff_ptr=ev_off,
            roff_ptr=res_off,
            ranks_ptr=out_ranks,
            res_ptr=out_res,
            NK=luts.shape[1],
            MANT=info.mantissa_bits,
            KMASK=luts.shape[1] - 1,
            BITS=info.bits,
            IS_FLOAT=info.is_float,
            NCP=ncp,
            N_LANES=class_ranks.lanes(n_classes),
            BLOCK=class_ranks.BLOCK,
            ROW=ROW,
            num_warps=NUM_WARPS,
        )
    return out_ranks, out_res
