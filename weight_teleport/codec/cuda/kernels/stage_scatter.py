"""The sampler's pause: scatters of staged new bit patterns into live weights."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.runtime import memory

BLOCK = 1024
"""Changes per program; the chunk scatter's rows hold at most this many."""


@triton.jit
def _scatter_kernel(base_ptr, off_ptr, val_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    off = tl.load(off_ptr + i, mask=m, other=0)
    tl.store(base_ptr + off, tl.load(val_ptr + i, mask=m), mask=m)


@triton.jit
def _chunk_scatter_kernel(base_ptr, rows_ptr, off_ptr, val_ptr, BLOCK: tl.constexpr):
    row = rows_ptr + tl.program_id(0).to(tl.int64) * 3
    chunk, first, stop = tl.load(row), tl.load(row + 1), tl.load(row + 2)
    i = first + tl.arange(0, BLOCK)
    m = i < stop
    off = tl.load(off_ptr + i, mask=m, other=0).to(tl.int64)
    tl.store(base_ptr + chunk + off, tl.load(val_ptr + i, mask=m), mask=m)


WALK_ROW = 7
"""Columns of a walk scatter's row: (the member's first element from the base's, the
chunk's first place in the member's walk, first change, stop, then the member's walk as
a 2-D view: inner extent, outer stride, inner stride)."""


@triton.jit
def _walk_scatter_kernel(base_ptr, rows_ptr, off_ptr, val_ptr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    row = rows_ptr + tl.program_id(0).to(tl.int64) * ROW
    at, start, first, stop = tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3)
    inner, outer_stride, inner_stride = tl.load(row + 4), tl.load(row + 5), tl.load(row + 6)
    i = first + tl.arange(0, BLOCK)
    m = i < stop
    p = start + tl.load(off_ptr + i, mask=m, other=0).to(tl.int64)
    tl.store(
        base_ptr + at + (p // inner) * outer_stride + (p % inner) * inner_stride, tl.load(val_ptr + i, mask=m), mask=m
    )


def scatter(base: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
    """base[offsets[i]] = values[i] (int64 offsets from `base`'s first element)."""
    assert memory.on_device(base) and base.dtype == values.dtype
    memory.require(offsets, torch.int64)
    memory.require(values)
    n = offsets.numel()
    assert values.numel() == n
    if n:
        _scatter_kernel[(triton.cdiv(n, BLOCK),)](base, offsets, values, n, BLOCK=BLOCK)


def scatter_chunks(base: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
    """For every row (chunk, first, stop) of `rows` ([n, 3] int64, stop - first <= BLOCK) and
    i in [first, stop): base[chunk + offsets[i]] = values[i]. `offsets` are int32 offsets in
    a chunk, `chunk` the chunk's first element counted from `base`'s, possibly in another
    allocation of the same element type (several live tensors patched by one launch; the
    caller proves each lands in a live tensor)."""
    assert memory.on_device(base) and base.dtype == values.dtype
    memory.require(offsets, torch.int32)
    memory.require(values)
    assert rows.dtype == torch.int64 and rows.is_contiguous() and rows.dim() == 2 and rows.shape[1] == 3
    assert offsets.numel() == values.numel()
    if rows.shape[0]:
        _chunk_scatter_kernel[(rows.shape[0],)](base, rows, offsets, values, BLOCK=BLOCK)


def scatter_walks(base: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
    """For every row of `rows` ([n, WALK_ROW] int64: at, start, first, stop, inner,
    outer_stride, inner_stride; stop - first <= BLOCK) and i in [first, stop), with
    p = start + offsets[i]: base[at + (p // inner) * outer_stride + (p % inner) * inner_stride]
    = values[i]. Writes changes of walk views that are not contiguous (a column-parallel
    shard walked by columns) where they lie in memory, from the chunks' int32 offsets, as
    `scatter_chunks` writes contiguous tensors: no per-change address is stored."""
    assert memory.on_device(base) and base.dtype == values.dtype
    memory.require(offsets, torch.int32)
    memory.require(values)
    assert rows.dtype == torch.int64 and rows.is_contiguous() and rows.dim() == 2 and rows.shape[1] == WALK_ROW
    assert offsets.numel() == values.numel()
    if rows.shape[0]:
        _walk_scatter_kernel[(rows.shape[0],)](base, rows, offsets, values, ROW=WALK_ROW, BLOCK=BLOCK)
