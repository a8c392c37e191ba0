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
    layout.require(src, torch.uint8)
    layout.require(dst, torch.uint8)
    assert ((src_off + length <= src.numel()) & (dst_off + length <= dst.numel())).all()
    keep = length > 0
    rows = np.stack([src_off[keep], dst_off[keep], length[keep]], 1)
    if rows.size:
        _gather_kernel[(rows.shape[0],)](src, dst, layout.to_device([rows], src.device)[0], PIECE=PIECE)
