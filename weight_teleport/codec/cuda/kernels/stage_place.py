"""Sparse chunks on the sampler: place decoded events on the live weights, on the GPU, in
one launch over the chunks of every sparse tensor of one element type (a chunk table): the
warp kernel `place_lanes` of warp.cu where it runs, else the Triton kernel here.

Each element finds its class (old value's exponent) and class rank, looks its rank up in
its segment's event bitmap, and, when changed, takes residual number (events before it, or
non-events before it in an inverted class) of its segment. It writes its offset in its
chunk and its new bit pattern in position order: at its block's first output (an exclusive
prefix over the blocks' change counts, which a first pass reads off the bitmaps) plus the
changes before it in its block. The outputs are ordered by chunk, then position, so the
pause writes each chunk front to back. Slots outside [0, n) (a pack whose streams do not
fit, which the caller refuses after its one sync) are neither read nor written. The same
pass sums the digest terms of the old and of the patched words per block (the warp kernel
takes the old from the class counts' pass)."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.kernels import chunk_table, class_ranks, warp
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.bitops import (
    as_int64,
    key,
    narrow_bits,
    popc32,
    stored_bits,
    unkey,
    word_terms,
    wrap,
)

ROW, NUM_WARPS = 8, 4
"""Tile rows and warps of the Triton placement kernel: the fastest shape tried (the staged
patch does not depend on it)."""
BLOCKS = 128
"""Blocks of one program of the block-count pass."""


@triton.jit
def _rank(bitmap_ptr, pref_ptr, b, inclusive: tl.constexpr, mask):
    """Set bits of the bitmap before bit index `b` (through it when `inclusive`)."""
    word = tl.load(bitmap_ptr + (b >> 5), mask=mask, other=0).to(tl.uint32, bitcast=True)
    bit = (b & 31).to(tl.uint32)
    if inclusive:
        low = (tl.full(b.shape, 2, tl.uint32) << bit) - 1  # bits 0..bit (2 << 31 wraps to 0: all ones)
    else:
        low = (tl.full(b.shape, 1, tl.uint32) << bit) - 1
    return tl.load(pref_ptr + (b >> 5), mask=mask, other=0) + popc32(word & low).to(tl.int32)


@triton.jit
def _block_changes_kernel(
    base_ptr,
    counts_ptr,
    prog_ptr,
    rows_ptr,
    seg_ptr,
    inv_ptr,
    bitmap_ptr,
    pref_ptr,
    out_ptr,
    programs,
    n_bits,
    NCP: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS).to(tl.int64)
    live = pid < programs
    k = tl.load(prog_ptr + pid, mask=live, other=0).to(tl.int64)
    t = tl.load(rows_ptr + k * 5 + 3, mask=live, other=0)
    c = tl.arange(0, NCP)[None, :]
    at = pid[:, None] * NCP + c
    n = tl.load(counts_ptr + at, mask=live[:, None], other=0).to(tl.int64)
    has = live[:, None] & (n > 0)
    first = tl.load(seg_ptr + k[:, None] * NCP + c, mask=has, other=0) * 32 + tl.load(base_ptr + at, mask=has, other=0)
    a = tl.minimum(tl.maximum(first, 0), n_bits - 1)  # in range even for a pack that does not fit
    b = tl.minimum(tl.maximum(first + n - 1, 0), n_bits - 1)
    ones = _rank(bitmap_ptr, pref_ptr, b, True, has) - _rank(bitmap_ptr, pref_ptr, a, False, has)
    inv = tl.load(inv_ptr + t[:, None] * NCP + c, mask=has, other=0) != 0
    changes = tl.where(has, tl.where(inv, n - ones, ones), 0)
    tl.store(out_ptr + pid, tl.sum(changes, 1), mask=live)


def block_starts(table: chunk_table.ChunkTable, counts, base, seg_word, inverted, bitmap, pref) -> torch.Tensor:
    """[programs] int64: where each block's changes start in the outputs, from the blocks'
    class counts and rank bases and the segments' event bitmaps."""
    out = torch.zeros(max(table.programs, 1), dtype=torch.int64, device=counts.device)
    if table.programs:
        _block_changes_kernel[(triton.cdiv(table.programs, BLOCKS),)](
            base,
            counts,
            table.program_chunk,
            table.rows,
            seg_word,
            inverted,
            bitmap,
            pref,
            out,
            table.programs,
            bitmap.numel() * 32,
            NCP=counts.shape[1],
            BLOCKS=BLOCKS,
        )
    return memory.starts(out)


@triton.jit
def _decode_kernel(
    old_ptr,
    rows_ptr,
    prog_ptr,
    lut_ptr,
    inv_ptr,
    base_ptr,
    seg_ptr,
    bitmap_ptr,
    pref_ptr,
    roff_ptr,
    res_ptr,
    start_ptr,
    pos_ptr,
    val_ptr,
    sums_ptr,
    n_res,
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
    b = narrow_bits(tl.load(old_ptr + off + offs, mask=valid, other=0), BITS)
    cls = class_ranks.classes(b, lut_ptr + t * NK, MANT, KMASK)
    r = tl.load(base_ptr + pid * NCP + cls) + class_ranks.class_ranks(cls, valid, N_LANES)
    seg = tl.load(seg_ptr + k * NCP + cls)
    wi = seg + (r >> 5)
    word = tl.load(bitmap_ptr + wi, mask=valid, other=0).to(tl.uint32, bitcast=True)
    bit = (r & 31).to(tl.uint32)
    inv = tl.load(inv_ptr + t * NCP + cls) != 0
    changed = valid & ((((word >> bit) & 1) != 0) != inv)
    below = popc32(word & ((tl.full(r.shape, 1, tl.uint32) << bit) - 1)).to(tl.int32)
    before = tl.load(pref_ptr + wi, mask=changed, other=0) - tl.load(pref_ptr + seg, mask=changed, other=0) + below
    slot = tl.load(roff_ptr + k * NCP + cls, mask=changed, other=0) + tl.where(inv, r - before, before)
    ch = changed.to(tl.int32)
    row_tot = tl.sum(ch, 1)
    out = tl.load(start_ptr + pid) + (tl.cumsum(ch, 1) - ch + (tl.cumsum(row_tot, 0) - row_tot)[:, None])
    put = changed & (slot >= 0) & (slot < n_res) & (out < n_res)
    d = stored_bits(tl.load(res_ptr + slot, mask=put, other=0), BITS)
    nb = unkey(wrap(key(b, IS_FLOAT, BITS) + d, BITS), IS_FLOAT, BITS)
    tl.store(pos_ptr + out, offs, mask=put)
    tl.store(val_ptr + out, as_int64(nb, BITS).to(val_ptr.dtype.element_ty), mask=put)
    word0 = (start + first) // (64 // BITS)
    flat_old = tl.reshape(b.to(tl.uint64), (BLOCK,))
    flat_new = tl.reshape(tl.where(changed, nb, b).to(tl.uint64), (BLOCK,))
    s_old = word_terms(flat_old, first, length, word0, BLOCK, BITS)
    s_new = word_terms(flat_new, first, length, word0, BLOCK, BITS)
    tl.store(sums_ptr + pid * 2, s_old.to(tl.int64, bitcast=True))
    tl.store(sums_ptr + pid * 2 + 1, s_new.to(tl.int64, bitcast=True))


def decode(
    table: chunk_table.ChunkTable,
    luts,
    inverted,
    n_classes: int,
    counts,
    base,
    seg_word,
    bitmap,
    pref,
    res_off,
    res,
    info,
    old_sums=None,
):
    """(offsets in their chunks int32, new bit patterns, [programs, 2] old and new digest word
    sums) of the changes of a chunk table's sparse tensors, by chunk then position. Per
    tensor: `luts` [T, keys] uint8, `inverted` [T, NCP] int8 (at most `n_classes` classes);
    per block `counts` (class counts) and `base` (class-rank bases) [programs, NCP] int32,
    and where the warp kernels run `old_sums` (class_ranks.table_counts', int64); per segment
    (chunk * NCP + class) `seg_word`, `res_off` int64."""
    old = memory.require(table.base, info.int_torch)
    for t, dt in (
        (bitmap, torch.int32),
        (pref, torch.int32),
        (res, torch.int64),
        (seg_word, torch.int64),
        (res_off, torch.int64),
    ):
        memory.require(t, dt)
    ncp = base.shape[1]
    assert base.dtype == torch.int32 and base.is_contiguous() and base.shape[0] == table.programs
    assert counts.dtype == torch.int32 and counts.shape == base.shape and counts.is_contiguous()
    assert inverted.dtype == torch.int8 and inverted.is_contiguous() and inverted.shape[1] == ncp
    assert luts.dtype == torch.uint8 and luts.is_contiguous() and seg_word.numel() == table.chunks * ncp
    n = res.numel()
    pos = torch.empty(n, dtype=torch.int32, device=old.device)
    val = torch.empty(n, dtype=info.int_torch, device=old.device)
    sums = torch.zeros((max(table.programs, 1), 2), dtype=torch.int64, device=old.device)
    starts = block_starts(table, counts, base, seg_word, inverted, bitmap, pref)
    if table.programs and warp.available(old):
        assert old_sums is not None and old_sums.dtype == torch.int64 and old_sums.shape == (table.programs,)
        warp.launch(
            "place_lanes",
            table,
            info,
            warp.PlaceParams.of(
                old=old,
                rows=table.rows,
                prog=table.program_chunk,
                lut=luts,
                inv_tab=inverted,
                counts=counts,
                base=base,
                seg_word=seg_word,
                bitmap=bitmap,
                pref=pref,
                roff=res_off,
                res=res,
                starts=starts,
                old_sums=old_sums,
                pos=pos,
                val=val,
                sums=sums,
                n_words=bitmap.numel(),
                n_res=n,
                programs=table.programs,
            ),
            NCP=ncp,
        )
    elif table.programs:
        _decode_kernel[(table.programs,)](
            old_ptr=old,
            rows_ptr=table.rows,
            prog_ptr=table.program_chunk,
            lut_ptr=luts,
            inv_ptr=inverted,
            base_ptr=base,
            seg_ptr=seg_word,
            bitmap_ptr=bitmap,
            pref_ptr=pref,
            roff_ptr=res_off,
            res_ptr=res,
            start_ptr=starts,
            pos_ptr=pos,
            val_ptr=val,
            sums_ptr=sums,
            n_res=n,
            NK=luts.shape[1],
            MANT=info.mantissa_bits,
            KMASK=(1 << info.exponent_bits) - 1,
            BITS=info.bits,
            IS_FLOAT=info.is_float,
            NCP=ncp,
            N_LANES=class_ranks.lanes(n_classes),
            BLOCK=class_ranks.BLOCK,
            ROW=ROW,
            num_warps=NUM_WARPS,
        )
    return pos, val, sums
