"""Byte ranges of one device buffer copied into another in one launch: the streams of a
pack gathered into its payload on the GPU, and into the stage's buffer. One program per
range copies it PIECE bytes at a time."""

import numpy as np
import torch
import triton
import triton.language as tl
from numba import njit

from weight_teleport.codec.cuda.runtime import memory

PIECE = 4096


@triton.jit
def _gather_kernel(src_ptr, dst_ptr, ranges_ptr, PIECE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    src, dst, n = tl.load(ranges_ptr + pid * 3), tl.load(ranges_ptr + pid * 3 + 1), tl.load(ranges_ptr + pid * 3 + 2)
    offs = tl.arange(0, PIECE).to(tl.int64)
    t = n * 0  # int64, as the lengths
    while t < n:
        at = t + offs
        keep = at < n
        tl.store(dst_ptr + dst + at, tl.load(src_ptr + src + at, mask=keep), mask=keep)
        t += PIECE


def gather(
    src: torch.Tensor, dst: torch.Tensor, src_off: torch.Tensor, dst_off: torch.Tensor, length: torch.Tensor
) -> None:
    """dst[dst_off[i]:+length[i]] = src[src_off[i]:+length[i]] for every range, the ranges'
    table on the device (made there, unchecked: the caller's ranges lie inside both
    buffers; ranges of length 0 copy nothing). No sync."""
    memory.require(src, torch.uint8)
    memory.require(dst, torch.uint8)
    if length.numel():
        rows = torch.stack([src_off.reshape(-1), dst_off.reshape(-1), length.reshape(-1)], 1).long()
        _gather_kernel[(rows.shape[0],)](src, dst, rows, PIECE=PIECE)


@njit(nogil=True, cache=True)
def _inside(rows, n_src, n_dst) -> bool:
    """Whether every row copies a non-empty range inside both buffers, in one compiled pass
    (numpy's temporaries over a stage's tens of thousands of rows cost more)."""
    for i in range(rows.shape[0]):
        a, b, n = rows[i, 0], rows[i, 1], rows[i, 2]
        if n <= 0 or a < 0 or b < 0 or a > n_src - n or b > n_dst - n:
            return False
    return True


def gather_rows(src: torch.Tensor, dst: torch.Tensor, rows: np.ndarray) -> None:
    """The copies of `gather` as [n, 3] int64 rows (source offset, destination offset,
    length > 0)."""
    memory.require(src, torch.uint8)
    memory.require(dst, torch.uint8)
    assert _inside(rows, src.numel(), dst.numel())
    if rows.size:
        _gather_kernel[(rows.shape[0],)](src, dst, memory.upload(rows, src.device), PIECE=PIECE)
