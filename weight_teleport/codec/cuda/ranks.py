"""Context classes of a chunk on the GPU: per-block class counts and in-block class ranks.

Elements are split into blocks of BLOCK that never straddle a chunk: in one tensor,
program p covers block p % BPC of chunk p // BPC; over a chunk table (codec/cuda/blocks.py)
the table says which. A class's rank of an element is its index among the chunk's elements
of the same class (the order its gap stream counts in)."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import blocks, layout
from weight_teleport.codec.cuda.bitops import to_bits

BLOCK = 2048
FIELD = 12
"""Bits of one class's running count in a packed cumsum lane (BLOCK < 2^FIELD)."""
PER_LANE = 5


def lanes(n_classes: int) -> int:
    """int64 cumsum lanes needed for `n_classes` classes."""
    return -(-n_classes // PER_LANE)


def pow2(n: int) -> int:
    """Smallest power of two >= max(n, 16) (Triton's histogram and arange need one)."""
    return max(16, 1 << (int(n) - 1).bit_length())


@triton.jit
def chunk_block(pid, numel, chunk_elems, bpc, BLOCK: tl.constexpr):
    """(chunk, first element, end of the block's chunk, offsets, valid) of program `pid`."""
    k = pid // bpc
    first = k * chunk_elems + (pid % bpc) * BLOCK
    stop = tl.minimum(k * chunk_elems + chunk_elems, numel)
    offs = first + tl.arange(0, BLOCK).to(tl.int64)
    return k, first, stop, offs, offs < stop


@triton.jit
def table_block(pid, rows_ptr, prog_ptr, BLOCK: tl.constexpr):
    """(chunk, tensor, chunk offset from the base, chunk start in its tensor, chunk length,
    first element of the block in the chunk, offsets in the chunk, valid) of program `pid`."""
    k = tl.load(prog_ptr + pid).to(tl.int64)
    row = rows_ptr + k * 5
    off, length, start = tl.load(row + 0), tl.load(row + 1), tl.load(row + 2)
    t, p0 = tl.load(row + 3), tl.load(row + 4)
    first = (pid - p0) * BLOCK
    offs = first + tl.arange(0, BLOCK).to(tl.int64)
    return k, t, off, start, length, first, offs, offs < length


@triton.jit
def classes(b, lut_ptr, MANT: tl.constexpr, KMASK: tl.constexpr):
    """Context class of each bit pattern (the class map of its exponent field)."""
    return tl.load(lut_ptr + ((b >> MANT) & KMASK).to(tl.int32)).to(tl.int32)


@triton.jit
def class_ranks(cls, flag, N_LANES: tl.constexpr, BLOCK: tl.constexpr):
    """Per element, the number of flagged elements of its class before it in the block.
    Classes share int64 cumsums, PER_LANE 12-bit counters to a lane."""
    lane = cls // 5
    shift = ((cls % 5) * 12).to(tl.int64)
    rank = tl.zeros([BLOCK], tl.int32)
    for L in tl.static_range(N_LANES):
        one = tl.where(flag & (lane == L), tl.full([BLOCK], 1, tl.int64) << shift, 0)
        before = tl.cumsum(one, 0) - one
        rank = tl.where(lane == L, ((before >> shift) & 4095).to(tl.int32), rank)
    return rank


@triton.jit
def _counts_kernel(old_ptr, new_ptr, lut_ptr, inv_ptr, counts_ptr, events_ptr, numel, chunk_elems, bpc,
                   MANT: tl.constexpr, KMASK: tl.constexpr, BITS: tl.constexpr, NCP: tl.constexpr,
                   HAS_NEW: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    k, first, stop, offs, valid = chunk_block(pid, numel, chunk_elems, bpc, BLOCK)
    b = to_bits(tl.load(old_ptr + offs, mask=valid, other=0), BITS)
    cls = classes(b, lut_ptr, MANT, KMASK)
    out = pid * NCP + tl.arange(0, NCP)
    tl.store(counts_ptr + out, tl.histogram(cls, NCP, mask=valid))
    if HAS_NEW:
        n = to_bits(tl.load(new_ptr + offs, mask=valid, other=0), BITS)
        inv = tl.load(inv_ptr + cls) != 0
        tl.store(events_ptr + out, tl.histogram(cls, NCP, mask=valid & ((b != n) != inv)))


def class_counts(old: torch.Tensor, new: torch.Tensor | None, lut: torch.Tensor, inverted: torch.Tensor,
                 info, chunk_elems: int):
    """[blocks, NCP] int32 counts of each class's elements and (with `new`) events per block."""
    layout.require(old, info.int_torch)
    layout.require(lut, torch.uint8)
    layout.require(inverted, torch.int8)
    if new is not None:
        assert layout.require(new, old.dtype).numel() == old.numel()
    n_chunks, bpc = triton.cdiv(old.numel(), chunk_elems), triton.cdiv(chunk_elems, BLOCK)
    ncp = pow2(inverted.numel() + 1)
    counts = torch.empty((n_chunks * bpc, ncp), dtype=torch.int32, device=old.device)
    events = torch.empty_like(counts) if new is not None else counts
    if counts.numel():
        _counts_kernel[(n_chunks * bpc,)](
            old, old if new is None else new, lut, inverted, counts, events, old.numel(), chunk_elems, bpc,
            MANT=info.mantissa_bits, KMASK=(1 << info.exponent_bits) - 1, BITS=info.bits, NCP=ncp,
            HAS_NEW=new is not None, BLOCK=BLOCK)
    return counts, (events if new is not None else None)


def block_bases(counts: torch.Tensor, n_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(exclusive per-chunk prefix of each block's counts, [chunks, NCP] int64 totals)."""
    per_chunk = counts.view(n_chunks, -1, counts.shape[1])
    incl = per_chunk.cumsum(1, dtype=torch.int32)
    return (incl - per_chunk).view_as(counts).contiguous(), incl[:, -1].to(torch.int64)


@triton.jit
def _table_counts_kernel(base_ptr, rows_ptr, prog_ptr, lut_ptr, counts_ptr, NK: tl.constexpr, MANT: tl.constexpr,
                         KMASK: tl.constexpr, BITS: tl.constexpr, NCP: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    k, t, off, start, length, first, offs, valid = table_block(pid, rows_ptr, prog_ptr, BLOCK)
    b = to_bits(tl.load(base_ptr + off + offs, mask=valid, other=0), BITS)
    cls = classes(b, lut_ptr + t * NK, MANT, KMASK)
    tl.store(counts_ptr + pid * NCP + tl.arange(0, NCP), tl.histogram(cls, NCP, mask=valid))


def table_counts(table: blocks.ChunkTable, luts: torch.Tensor, info, ncp: int) -> torch.Tensor:
    """[programs, ncp] int32 counts of each class's elements per block of a chunk table's
    tensors; `luts` [tensors, keys] uint8 are their class maps."""
    layout.require(table.base, info.int_torch)
    nk = 1 << info.exponent_bits
    assert luts.dtype == torch.uint8 and luts.is_contiguous() and luts.shape[1] == nk
    counts = torch.empty((table.programs, ncp), dtype=torch.int32, device=table.base.device)
    if table.programs:
        _table_counts_kernel[(table.programs,)](
            table.base, table.rows, table.program_chunk, luts, counts, NK=nk, MANT=info.mantissa_bits,
            KMASK=nk - 1, BITS=info.bits, NCP=ncp, BLOCK=BLOCK)
    return counts


def table_bases(counts: torch.Tensor, table: blocks.ChunkTable) -> tuple[torch.Tensor, torch.Tensor]:
    """(exclusive per-chunk prefix of each block's counts (int32), [chunks, NCP] int64 totals)."""
    incl = counts.t().cumsum(1, dtype=torch.int64).t()  # a scan along rows: fast on the device
    p0 = table.rows[:, blocks.PROG0]
    last = torch.cat([p0[1:], p0.new_full((1,), table.programs)]) - 1
    before = incl[p0] - counts[p0]
    base = incl - counts - before[table.program_chunk.long()]
    return base.to(torch.int32).contiguous(), incl[last] - before
