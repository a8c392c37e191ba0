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
