"""The sampler's pause: one scatter of staged new bit patterns into live weights."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout

BLOCK = 1024


@triton.jit
def _scatter_kernel(base_ptr, off_ptr, val_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    off = tl.load(off_ptr + i, mask=m, other=0)
    tl.store(base_ptr + off, tl.load(val_ptr + i, mask=m), mask=m)


def scatter(base: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
    """base[offsets[i]] = values[i], where `offsets` count elements from `base`'s first
    element and may reach into other allocations of the same element type (several live
    tensors patched by one launch; the caller proves each offset lands in a live tensor)."""
    assert layout.on_device(base) and base.dtype == values.dtype
    layout.require(offsets, torch.int64)
    layout.require(values)
    n = offsets.numel()
    assert values.numel() == n
    if n:
        _scatter_kernel[(triton.cdiv(n, BLOCK),)](base, offsets, values, n, BLOCK=BLOCK)
