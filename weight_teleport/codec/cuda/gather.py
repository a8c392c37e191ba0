"""Byte ranges of one device buffer copied into another in one launch: the streams of a
pack gathered into its payload on the GPU. Ranges are cut into pieces of at most PIECE
bytes, one program each."""

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout

PIECE = 4096


@triton.jit
def _gather_kernel(src_ptr, dst_ptr, pieces_ptr, PIECE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    src, dst, n = tl.load(pieces_ptr + pid * 3), tl.load(pieces_ptr + pid * 3 + 1), tl.load(pieces_ptr + pid * 3 + 2)
    offs = tl.arange(0, PIECE).to(tl.int64)
    keep = offs < n
    tl.store(dst_ptr + dst + offs, tl.load(src_ptr + src + offs, mask=keep), mask=keep)


def pieces(src: np.ndarray, dst: np.ndarray, length: np.ndarray) -> np.ndarray:
    """[pieces, 3] int64 (source offset, destination offset, bytes) of the ranges, cut at PIECE."""
    owner, piece = layout.items(-(-length // PIECE))
    at = piece * PIECE
    return np.stack([src[owner] + at, dst[owner] + at, np.minimum(length[owner] - at, PIECE)], 1).astype(np.int64)


def gather(src: torch.Tensor, dst: torch.Tensor, src_off: np.ndarray, dst_off: np.ndarray,
           length: np.ndarray) -> None:
    """dst[dst_off[i]:+length[i]] = src[src_off[i]:+length[i]] for every range (no sync)."""
    layout.require(src, torch.uint8)
    layout.require(dst, torch.uint8)
    assert ((src_off + length <= src.numel()) & (dst_off + length <= dst.numel())).all()
    rows = pieces(src_off, dst_off, length)
    if rows.size:
        _gather_kernel[(rows.shape[0],)](src, dst, layout.to_device([rows], src.device)[0], PIECE=PIECE)
