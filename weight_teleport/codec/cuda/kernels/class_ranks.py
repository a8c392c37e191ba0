"""Context classes of a chunk on the GPU: per-block class counts and in-block class ranks.

On NVIDIA GPUs the CUDA C warp kernels (warp.cu) do this work; the Triton kernels here
compute the same outputs and run under Triton's CPU interpreter (CI) and where NVRTC cannot
be loaded, and their wrappers choose between the two.

Elements are split into blocks of BLOCK that never straddle a chunk; a chunk table
(codec/cuda/kernels/chunk_table.py) says which block each program covers. A class's rank of an element
is its index among the chunk's elements of the same class (the order its gap stream counts
in). Kernels work on a [BLOCK // ROW, ROW] tile of a block; the events and placement
kernels each take the tile rows and warps that ran fastest for them (encode_events.ROW,
stage_place.ROW). The shape never changes a pack, only the kernels' speed.

Ranks keep PER_LANE classes' running counts as FIELD-bit fields of an int64 lane. Counts
alone need less: with rows of COUNT_ROW elements a row's counts of all 16 classes fit one
int64 as 4-bit fields, unpacked once per row, which is cheaper than the ranks' running
counts. Ranks are not built that way: looking up the rows before an element (tl.gather) or
regrouping them into 12-bit lanes cost more than the running counts."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.kernels import chunk_table, warp
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.bitops import narrow_bits

BLOCK = 1024
"""Elements of one program of the Triton kernels."""
WARP_BLOCK = 2048
"""Elements of one program of the stage's warp kernels (class counts, placement): 2048
rather than 1024 makes the class counts cheaper and leaves the placement as fast; 4096
slows the placement down."""
COUNT_ROW = 8
"""Consecutive elements of one row of a block's [BLOCK // ROW, ROW] tile in the counting
kernel: a class's count within a row fits a 4-bit field, so the counts of all CLASSES
classes share one int64. The rank kernels choose their own rows and warps."""
CLASSES = tl.constexpr(16)
"""Classes a tensor may have (the class plan's limit)."""
NUM_WARPS = 4
"""Warps of the counting kernel."""
FIELD = tl.constexpr(12)
"""Bits of one class's running count in a packed cumsum lane (BLOCK < 2^FIELD)."""
FIELD_MASK = tl.constexpr(4095)
PER_LANE = tl.constexpr(5)


def lanes(n_classes: int) -> int:
    """int64 cumsum lanes needed for `n_classes` classes."""
    return -(-n_classes // PER_LANE.value)


def pow2(n: int) -> int:
    """Smallest power of two >= max(n, 16) (Triton's histogram and arange need one)."""
    return max(16, 1 << (int(n) - 1).bit_length())


@triton.jit
def table_block(pid, rows_ptr, prog_ptr, BLOCK: tl.constexpr):
    """(chunk, tensor, chunk offset from the base, chunk start in its tensor, chunk length,
    first element of the block in the chunk) of program `pid` (int64 scalars)."""
    k = tl.load(prog_ptr + pid).to(tl.int64)
    row = rows_ptr + k * 5
    off, length, start = tl.load(row + 0), tl.load(row + 1), tl.load(row + 2)
    t, p0 = tl.load(row + 3), tl.load(row + 4)
    return k, t, off, start, length, (pid - p0) * BLOCK


@triton.jit
def grid(first, length, BLOCK: tl.constexpr, ROW: tl.constexpr):
    """(int32 offsets in the chunk of the block starting at `first`, valid), as a
    [BLOCK // ROW, ROW] tile: a row is a run of consecutive elements that few threads hold,
    so counting along it is sequential work and only row totals cross threads."""
    r = tl.arange(0, BLOCK // ROW)
    offs = first.to(tl.int32) + r[:, None] * ROW + tl.arange(0, ROW)[None, :]
    return offs, offs < length


@triton.jit
def classes(b, lut_ptr, MANT: tl.constexpr, KMASK: tl.constexpr):
    """Context class of each bit pattern (the class map of its exponent field)."""
    return tl.load(lut_ptr + ((b >> MANT) & KMASK).to(tl.int32)).to(tl.int32)


@triton.jit
def class_ranks(cls, flag, N_LANES: tl.constexpr):
    """Per element of a `grid` tile, the number of flagged elements of its class before it
    in the tile. Classes share int64 lanes, PER_LANE FIELD-bit counters to a lane: per lane
    a prefix sum along the rows, then one over the row totals."""
    lane = cls // PER_LANE
    shift = ((cls % PER_LANE) * FIELD).to(tl.int64)
    unit = tl.full(cls.shape, 1, tl.int64) << shift
    rank = tl.zeros(cls.shape, tl.int32)
    for L in tl.static_range(N_LANES):
        one = tl.where(flag & (lane == L), unit, 0)
        row_tot = tl.sum(one, 1)
        before = tl.cumsum(one, 1) - one + (tl.cumsum(row_tot, 0) - row_tot)[:, None]
        rank = tl.where(lane == L, ((before >> shift) & FIELD_MASK).to(tl.int32), rank)
    return rank


@triton.jit
def class_counts(cls, flag, NCP: tl.constexpr):
    """[NCP] int32 counts of the flagged elements of each class of a `grid` tile whose rows
    hold at most 15 elements: per row the counts of all classes as 4-bit fields of one int64
    (class c at bit 4c), unpacked once per row."""
    packed = tl.sum(tl.where(flag, tl.full(cls.shape, 1, tl.int64) << (cls * 4).to(tl.int64), 0), 1)
    c = tl.arange(0, NCP)
    field = (packed[:, None] >> (tl.minimum(c, CLASSES - 1) * 4).to(tl.int64)[None, :]) & 15
    return tl.sum(tl.where(c[None, :] < CLASSES, field, 0).to(tl.int32), 0)


@triton.jit
def _table_counts_kernel(
    base_ptr,
    rows_ptr,
    prog_ptr,
    lut_ptr,
    counts_ptr,
    new_ptr,
    new_off_ptr,
    inv_ptr,
    events_ptr,
    NK: tl.constexpr,
    MANT: tl.constexpr,
    KMASK: tl.constexpr,
    BITS: tl.constexpr,
    NCP: tl.constexpr,
    HAS_NEW: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    k, t, off, start, length, first = table_block(pid, rows_ptr, prog_ptr, BLOCK)
    offs, valid = grid(first, length, BLOCK, ROW)
    b = narrow_bits(tl.load(base_ptr + off + offs, mask=valid, other=0), BITS)
    cls = classes(b, lut_ptr + t * NK, MANT, KMASK)
    out = pid * NCP + tl.arange(0, NCP)
    tl.store(counts_ptr + out, class_counts(cls, valid, NCP))
    if HAS_NEW:
        n = narrow_bits(tl.load(new_ptr + tl.load(new_off_ptr + k) + offs, mask=valid, other=0), BITS)
        inv = tl.load(inv_ptr + t * NCP + cls) != 0
        tl.store(events_ptr + out, class_counts(cls, valid & ((b != n) != inv), NCP))


def stage_block(tensor: torch.Tensor) -> int:
    """Elements of a program of the stage's chunk table for weights on `tensor`'s device:
    WARP_BLOCK where the warp kernels run (the placement, warp.cu's place_lanes, gives each
    lane BLOCK / 32 of them), else the Triton kernels' BLOCK."""
    return WARP_BLOCK if warp.available(tensor) else BLOCK


def table_counts(
    table: chunk_table.ChunkTable,
    luts: torch.Tensor,
    info,
    ncp: int,
    n_classes: int,
    new: chunk_table.Paired | None = None,
    inverted: torch.Tensor | None = None,
):
    """[programs, ncp] int32 counts of each class's elements per block of a chunk table's
    tensors; `luts` [tensors, keys] uint8 are their class maps (at most `n_classes` classes).
    Returned with:
    - without `new` (the sampler's live weights): each block's digest word sum of the
      weights ([programs] int64) where the warp kernel counts, else None. It reads every
      word anyway and runs while the host reads the pack's tables, so the placement
      (warp.cu's place_lanes) takes these sums instead of computing them on the stage's
      critical path; the Triton placement sums them itself.
    - with the new tensors `new` and the [tensors, ncp] int8 `inverted` flags: each block's
      event counts (the Triton kernel: where the warp kernels run, the trainer takes its
      counts from the scan's histograms, warp.hist_counts)."""
    memory.require(table.base, info.int_torch)
    nk = 1 << info.exponent_bits
    fast = table.programs and new is None and warp.available(table.base)
    assert table.block == (stage_block(table.base) if new is None else BLOCK)
    assert n_classes <= min(ncp, CLASSES.value)
    assert luts.dtype == torch.uint8 and luts.is_contiguous() and luts.shape[1] == nk
    counts = torch.empty((table.programs, ncp), dtype=torch.int32, device=table.base.device)
    events = counts
    if new is not None:
        assert inverted is not None  # given with `new`
        memory.require(new.base, info.int_torch)
        assert new.offsets.shape == (table.chunks,) and new.offsets.dtype == torch.int64
        assert inverted.dtype == torch.int8 and inverted.is_contiguous() and inverted.shape[1] == ncp
        events = torch.empty_like(counts)
    if fast:
        old_sums = torch.empty(table.programs, dtype=torch.int64, device=table.base.device)
        warp.launch(
            "class_counts", table, info, [table.base, table.rows, table.program_chunk, luts, counts, old_sums], NCP=ncp
        )
        return counts, old_sums
    if table.programs:
        _table_counts_kernel[(table.programs,)](
            table.base,
            table.rows,
            table.program_chunk,
            luts,
            counts,
            table.base if new is None else new.base,
            table.rows if new is None else new.offsets,
            luts if inverted is None else inverted,
            events,
            NK=nk,
            MANT=info.mantissa_bits,
            KMASK=nk - 1,
            BITS=info.bits,
            NCP=ncp,
            HAS_NEW=new is not None,
            BLOCK=BLOCK,
            ROW=COUNT_ROW,
            num_warps=NUM_WARPS,
        )
    return counts, (None if new is None else events)


@triton.jit
def _bases_kernel(counts_ptr, bounds_ptr, base_ptr, tot_ptr, NCP: tl.constexpr, R: tl.constexpr):
    k = tl.program_id(0).to(tl.int64)
    first, stop = tl.load(bounds_ptr + k), tl.load(bounds_ptr + k + 1)
    c = tl.arange(0, NCP)
    carry = tl.zeros([NCP], tl.int64)
    at = first
    while at < stop:
        rows = at + tl.arange(0, R).to(tl.int64)
        cell = rows[:, None] * NCP + c[None, :]
        keep = (rows < stop)[:, None]
        n = tl.load(counts_ptr + cell, mask=keep, other=0).to(tl.int64)
        tl.store(base_ptr + cell, (tl.cumsum(n, 0) - n + carry[None, :]).to(tl.int32), mask=keep)
        carry += tl.sum(n, 0)
        at += R
    tl.store(tot_ptr + k * NCP + c, carry)


def table_bases(counts: torch.Tensor, table: chunk_table.ChunkTable) -> tuple[torch.Tensor, torch.Tensor]:
    """(exclusive per-chunk prefix of each block's counts (int32), [chunks, NCP] int64
    totals): one program per chunk walks its blocks."""
    assert counts.dtype == torch.int32 and counts.is_contiguous() and counts.shape[0] == table.programs
    ncp = counts.shape[1]
    base = torch.empty_like(counts)
    tot = torch.empty((table.chunks, ncp), dtype=torch.int64, device=counts.device)
    if table.chunks:
        bounds = torch.cat([table.rows[:, chunk_table.PROG0], table.rows.new_full((1,), table.programs)])
        _bases_kernel[(table.chunks,)](counts, bounds, base, tot, NCP=ncp, R=64)
    return base, tot
