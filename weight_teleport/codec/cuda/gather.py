"""Byte ranges of one device buffer copied into another in one launch: the streams of a
pack gathered into its payload on the GPU. One program per range copies it PIECE bytes at a
time (the ranges' table is all the host builds)."""

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout

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


def gather(src: torch.Tensor, dst: torch.Tensor, src_off: np.ndarray, dst_off: np.ndarray,
           length: np.ndarray) -> None:
    """dst[dst_off[i]:+length[i]] = src[src_off[i]:+length[i]] for every range (no sync)."""
    keep = length > 0
    gather_rows(src, dst, np.stack([src_off[keep], dst_off[keep], length[keep]], 1))


def gather_rows(src: torch.Tensor, dst: torch.Tensor, rows: np.ndarray) -> None:
    """The copies of `gather` as [n, 3] int64 rows (source offset, destination offset,
    length > 0)."""
    layout.require(src, torch.uint8)
    layout.require(dst, torch.uint8)
    ends = rows[:, :2] + rows[:, 2:]
    assert (rows[:, 2] > 0).all() and (ends[:, 0] <= src.numel()).all() and (ends[:, 1] <= dst.numel()).all()
    if rows.size:
        _gather_kernel[(rows.shape[0],)](src, dst, layout.upload(rows, src.device), PIECE=PIECE)
