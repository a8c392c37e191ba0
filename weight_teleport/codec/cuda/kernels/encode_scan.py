"""The trainer's first pass over every chunk of a batch of tensors (one element type, one
launch): context-key histograms (all and changed elements) and the digest word sums of the
old and new tensors, fused in one read of both. Every tensor must start at an 8-byte
boundary (`aligned`): the kernel reads 8-byte words and cuts the elements out of them."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.kernels import chunk_table, warp
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.bitops import term
from weight_teleport.codec.cuda.kernels.class_ranks import pow2

BLOCK = 2048
TILES = 16
SPAN = BLOCK * TILES
"""Elements of one program (a block of the chunk table)."""


@triton.jit
def _scan_kernel(
    old_ptr,
    rows_ptr,
    prog_ptr,
    new_ptr,
    new_off_ptr,
    hist_ptr,
    sums_ptr,
    NK: tl.constexpr,
    NB: tl.constexpr,
    MANT: tl.constexpr,
    KMASK: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK: tl.constexpr,
    TILES: tl.constexpr,
):
    PW: tl.constexpr = 64 // BITS
    WORDS: tl.constexpr = BLOCK // PW
    pid = tl.program_id(0).to(tl.int64)
    k = tl.load(prog_ptr + pid).to(tl.int64)
    row = rows_ptr + k * 5
    off, length, start, p0 = tl.load(row + 0), tl.load(row + 1), tl.load(row + 2), tl.load(row + 4)
    first = (pid - p0) * (BLOCK * TILES)
    # 8-byte words of the chunk (the caller checks the alignment): the digest's words as
    # loaded, the elements cut out of them
    old_w = (old_ptr + off).to(tl.pointer_type(tl.int64))
    new_w = (new_ptr + tl.load(new_off_ptr + k)).to(tl.pointer_type(tl.int64))
    lane = (tl.arange(0, PW) * BITS).to(tl.uint64)
    hist = tl.zeros([NB], tl.int32)
    s_old = tl.zeros((), tl.uint64)
    s_new = tl.zeros((), tl.uint64)
    for i in range(TILES):
        w = (first + i * BLOCK) // PW + tl.arange(0, WORDS)
        inside = tl.minimum(tl.maximum(length - w * PW, 0), PW)
        keep = tl.where(
            inside == PW,
            0xFFFFFFFFFFFFFFFF,
            (tl.full([WORDS], 1, tl.uint64) << (tl.minimum(inside, PW - 1) * BITS).to(tl.uint64)) - 1,
        )
        wo = tl.load(old_w + w, mask=inside > 0, other=0).to(tl.uint64, bitcast=True) & keep
        wn = tl.load(new_w + w, mask=inside > 0, other=0).to(tl.uint64, bitcast=True) & keep
        key = ((wo[:, None] >> (lane[None, :] + MANT)) & KMASK).to(tl.int32)
        changed = ((((wo ^ wn)[:, None] >> lane[None, :]) & ((1 << BITS) - 1)) != 0).to(tl.int32)
        valid = tl.arange(0, PW)[None, :] < inside[:, None]
        hist += tl.histogram(
            tl.reshape(key + changed * NK, (BLOCK,), can_reorder=True),
            NB,
            mask=tl.reshape(valid, (BLOCK,), can_reorder=True),
        )
        j = start // PW + w
        s_old += tl.sum(tl.where(inside > 0, term(wo, j), 0), axis=0)
        s_new += tl.sum(tl.where(inside > 0, term(wn, j), 0), axis=0)
    tl.store(hist_ptr + pid * NB + tl.arange(0, NB), hist)
    tl.store(sums_ptr + pid * 2, s_old.to(tl.int64, bitcast=True))
    tl.store(sums_ptr + pid * 2 + 1, s_new.to(tl.int64, bitcast=True))


def aligned(flat: torch.Tensor) -> torch.Tensor:
    """`flat`, or a copy of it where it does not start at an 8-byte boundary."""
    return flat if flat.data_ptr() % 8 == 0 else flat.clone()


@dataclass
class Scanned:
    rows: torch.Tensor
    """[tensors, 2 * n_keys + 2] int64: per context key the element count, then per key the
    changed count, then the old and the new digest word sums."""
    hist: torch.Tensor
    """[programs, NB] int32: per program of the chunk table, the counts of key + n_keys *
    changed (the trainer counts its classes from them: warp.hist_counts)."""
    chunk_sums: torch.Tensor | None = None
    """[chunks, 2] int64: per chunk of the table, the old and the new digest word sums (when
    asked for)."""


def scan(table: chunk_table.ChunkTable, new: chunk_table.Paired, info, per_chunk: bool = False) -> Scanned:
    """The first pass over every tensor of a chunk table built with block SPAN (`new` the
    new tensors of the same shapes). `per_chunk`: the digest word sums of every chunk too
    (records that carry a digest per chunk). No sync."""
    memory.require(table.base, info.int_torch)
    memory.require(new.base, info.int_torch)
    assert table.block == SPAN and new.offsets.shape == (table.chunks,)
    assert table.base.data_ptr() % 8 == 0 and new.base.data_ptr() % 8 == 0, "scan reads 8-byte words"
    nk = 1 << info.exponent_bits
    nb = pow2(2 * nk)
    dev = table.base.device
    hist = torch.empty((table.programs, nb), dtype=torch.int32, device=dev)
    sums = torch.empty((table.programs, 2), dtype=torch.int64, device=dev)
    if table.programs and warp.available(table.base):
        warp.scan(table, info, nb, [table.base, table.rows, table.program_chunk, new.base, new.offsets, hist, sums])
    elif table.programs:
        _scan_kernel[(table.programs,)](
            table.base,
            table.rows,
            table.program_chunk,
            new.base,
            new.offsets,
            hist,
            sums,
            NK=nk,
            NB=nb,
            MANT=info.mantissa_bits,
            KMASK=nk - 1,
            BITS=info.bits,
            BLOCK=BLOCK,
            TILES=TILES,
        )
    keys = table.per_tensor(hist)
    changed = keys[:, nk : 2 * nk]
    chunks = None
    if per_chunk:  # a chunk's programs' sums added up, mod 2^64 as every digest sum
        chunks = torch.zeros((table.chunks, 2), dtype=torch.int64, device=dev)
        chunks.index_add_(0, table.program_chunk.long(), sums[: table.programs])
    return Scanned(torch.cat([keys[:, :nk] + changed, changed, table.per_tensor(sums)], 1), hist, chunks)
