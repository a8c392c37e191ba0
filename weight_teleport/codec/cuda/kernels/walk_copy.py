"""A run of a 2-D walk view copied into a flat array, in tiles: what the stage reads of a
tensor that is not contiguous (a row-parallel shard published by columns, walked by
columns), made once per stage. An element-wise copy of such a view reads one element per
memory sector when the walk runs across rows; a tile reads whole sectors along the memory's
own order and writes whole sectors along the walk's."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.runtime import memory

TILE = 64
"""Tile edge, in elements, of both the walk's outer and inner dimensions."""


@triton.jit
def _walk_copy_kernel(
    src_ptr, dst_ptr, start, count, first_outer, inner, outer_stride, inner_stride, inner_tiles, TILE: tl.constexpr
):
    pid = tl.program_id(0).to(tl.int64)
    o = first_outer + (pid // inner_tiles) * TILE + tl.arange(0, TILE).to(tl.int64)[:, None]
    i = (pid % inner_tiles) * TILE + tl.arange(0, TILE).to(tl.int64)[None, :]
    p = o * inner + i
    m = (i < inner) & (p >= start) & (p < start + count)
    v = tl.load(src_ptr + o * outer_stride + i * inner_stride, mask=m)
    tl.store(dst_ptr + (p - start), v, mask=m)


def copy_walk(src: torch.Tensor, out: torch.Tensor, start: int, geometry: tuple[int, int, int]) -> torch.Tensor:
    """out[k] = walk element start + k of `src` for k < out.numel(), the walk given as
    `live.walk_2d`'s (inner extent, outer stride, inner stride): walk position p lies at
    element (p // inner) * outer stride + (p % inner) * inner stride from `src`'s first.
    `src` and `out` are of one element type; `out` flat and contiguous. The caller keeps
    the run inside `src`'s walk. Returns `out`."""
    memory.require(out)
    assert memory.on_device(src) and src.dtype == out.dtype
    inner, outer_stride, inner_stride = geometry
    count = out.numel()
    if count:
        first, last = start // inner, (start + count - 1) // inner
        inner_tiles = triton.cdiv(inner, TILE)
        grid = (triton.cdiv(last - first + 1, TILE) * inner_tiles,)
        _walk_copy_kernel[grid](
            src, out, start, count, first, inner, outer_stride, inner_stride, inner_tiles, TILE=TILE
        )
    return out
