"""Context classes of a chunk on the GPU: per-block class counts and in-block class ranks.

Elements are split into blocks of BLOCK that never straddle a chunk; a chunk table
(codec/cuda/blocks.py) says which block each program covers. A class's rank of an element is its index among the chunk's elements
of the same class (the order its gap stream counts in)."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import blocks, layout
from weight_teleport.codec.cuda.bitops import narrow_bits

BLOCK = 2048
"""Elements of one program."""
TILE = 512
"""Elements a program handles at once (few registers a thread: no spills)."""
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
def tile(first, i, length, TILE: tl.constexpr):
    """(int32 offsets in the chunk of tile i of a block starting at `first`, valid)."""
    offs = (first + i * TILE).to(tl.int32) + tl.arange(0, TILE)
    return offs, offs < length


@triton.jit
def classes(b, lut_ptr, MANT: tl.constexpr, KMASK: tl.constexpr):
    """Context class of each bit pattern (the class map of its exponent field)."""
    return tl.load(lut_ptr + ((b >> MANT) & KMASK).to(tl.int32)).to(tl.int32)


@triton.jit
def class_ranks(cls, flag, carry, N_LANES: tl.constexpr, TILE: tl.constexpr):
    """(per element the number of flagged elements of its class before it in the block,
    the packed counts carried past this tile). Classes share int64 lanes, PER_LANE FIELD-bit
    counters to a lane; `carry` [NL] int64 holds each lane's counts of the earlier tiles."""
    lane = cls // PER_LANE
    shift = ((cls % PER_LANE) * FIELD).to(tl.int64)
    which = tl.arange(0, carry.shape[0])
    rank = tl.zeros([TILE], tl.int32)
    for L in tl.static_range(N_LANES):
        one = tl.where(flag & (lane == L), tl.full([TILE], 1, tl.int64) << shift, 0)
        before = tl.cumsum(one, 0) - one + tl.sum(tl.where(which == L, carry, 0), 0)
        rank = tl.where(lane == L, ((before >> shift) & FIELD_MASK).to(tl.int32), rank)
        carry += tl.where(which == L, tl.sum(one, 0), 0)
    return rank, carry


@triton.jit
def lane_counts(cls, flag, acc, N_LANES: tl.constexpr):
    """`acc` plus the packed per-class counts of the flagged elements (class_ranks' carry
    without the ranks)."""
    lane = cls // PER_LANE
    shift = ((cls % PER_LANE) * FIELD).to(tl.int64)
    which = tl.arange(0, acc.shape[0])
    for L in tl.static_range(N_LANES):
        one = tl.where(flag & (lane == L), tl.full(cls.shape, 1, tl.int64) << shift, 0)
        acc += tl.where(which == L, tl.sum(one, 0), 0)
    return acc


@triton.jit
def unpack_counts(acc, NCP: tl.constexpr):
    """[NCP] int32 counts of packed lane counts."""
    c = tl.arange(0, NCP)
    which = tl.arange(0, acc.shape[0])
    lane_of = tl.sum(tl.where(which[None, :] == (c // PER_LANE)[:, None], acc[None, :], 0), 1)
    return ((lane_of >> ((c % PER_LANE) * FIELD).to(tl.int64)) & FIELD_MASK).to(tl.int32)


@triton.jit
def _table_counts_kernel(base_ptr, rows_ptr, prog_ptr, lut_ptr, counts_ptr, new_ptr, new_off_ptr, inv_ptr,
                         events_ptr, NK: tl.constexpr, MANT: tl.constexpr, KMASK: tl.constexpr,
                         BITS: tl.constexpr, NCP: tl.constexpr, NL: tl.constexpr, N_LANES: tl.constexpr,
                         HAS_NEW: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    k, t, off, start, length, first = table_block(pid, rows_ptr, prog_ptr, BLOCK)
    noff = tl.load(new_off_ptr + k)
    all_acc = tl.zeros([NL], tl.int64)
    ev_acc = tl.zeros([NL], tl.int64)
    for i in tl.static_range(BLOCK // TILE):
        offs, valid = tile(first, i, length, TILE)
        b = narrow_bits(tl.load(base_ptr + off + offs, mask=valid, other=0), BITS)
        cls = classes(b, lut_ptr + t * NK, MANT, KMASK)
        all_acc = lane_counts(cls, valid, all_acc, N_LANES)
        if HAS_NEW:
            n = narrow_bits(tl.load(new_ptr + noff + offs, mask=valid, other=0), BITS)
            inv = tl.load(inv_ptr + t * NCP + cls) != 0
            ev_acc = lane_counts(cls, valid & ((b != n) != inv), ev_acc, N_LANES)
    out = pid * NCP + tl.arange(0, NCP)
    tl.store(counts_ptr + out, unpack_counts(all_acc, NCP))
    if HAS_NEW:
        tl.store(events_ptr + out, unpack_counts(ev_acc, NCP))


def table_counts(table: blocks.ChunkTable, luts: torch.Tensor, info, ncp: int, n_classes: int,
                 new: blocks.Paired | None = None, inverted: torch.Tensor | None = None):
    """[programs, ncp] int32 counts of each class's elements per block of a chunk table's
    tensors; `luts` [tensors, keys] uint8 are their class maps (at most `n_classes` classes).
    With the new tensors `new` and the [tensors, ncp] int8 `inverted` flags, also returns
    each block's event counts."""
    layout.require(table.base, info.int_torch)
    nk = 1 << info.exponent_bits
    assert table.block == BLOCK and n_classes <= ncp
    assert luts.dtype == torch.uint8 and luts.is_contiguous() and luts.shape[1] == nk
    counts = torch.empty((table.programs, ncp), dtype=torch.int32, device=table.base.device)
    events = counts
    if new is not None:
        layout.require(new.base, info.int_torch)
        assert new.offsets.shape == (table.chunks,) and new.offsets.dtype == torch.int64
        assert inverted.dtype == torch.int8 and inverted.is_contiguous() and inverted.shape[1] == ncp
        events = torch.empty_like(counts)
    if table.programs:
        _table_counts_kernel[(table.programs,)](
            table.base, table.rows, table.program_chunk, luts, counts,
            table.base if new is None else new.base, table.rows if new is None else new.offsets,
            luts if inverted is None else inverted, events, NK=nk, MANT=info.mantissa_bits,
            KMASK=nk - 1, BITS=info.bits, NCP=ncp, NL=pow2(lanes(ncp)), N_LANES=lanes(n_classes),
            HAS_NEW=new is not None, BLOCK=BLOCK, TILE=TILE)
    return counts if new is None else (counts, events)


def table_bases(counts: torch.Tensor, table: blocks.ChunkTable) -> tuple[torch.Tensor, torch.Tensor]:
    """(exclusive per-chunk prefix of each block's counts (int32), [chunks, NCP] int64 totals)."""
    incl = counts.t().cumsum(1, dtype=torch.int64).t()  # a scan along rows: fast on the device
    p0 = table.rows[:, blocks.PROG0]
    last = torch.cat([p0[1:], p0.new_full((1,), table.programs)]) - 1
    before = incl[p0] - counts[p0]
    base = incl - counts - before[table.program_chunk.long()]
    return base.to(torch.int32).contiguous(), incl[last] - before
