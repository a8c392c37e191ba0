"""The class-count, events and placement kernels as CUDA C warp code (warp.cu beside this),
compiled with NVRTC for each element type at first use.

A warp takes a block's elements 32 at a time; lanes vote their classes bit by bit, so an
element's rank among its class is a popcount and the running counts live in registers (see
warp.cu). The Triton kernels (ranks.py, sparse_encode.py, sparse_decode.py) compute the same
outputs with per-class prefix sums over a tile, and run where these cannot: under Triton's
CPU interpreter, or where NVRTC cannot be loaded. On the H200 the warp kernels are the
faster (BENCHMARKS.md)."""

import functools
import math
from pathlib import Path

import torch

from weight_teleport.codec.cuda import nvrtc

WARPS, UNROLL = 4, 8
"""Warps of a CTA (one block of the chunk table each) and 32-element slices loaded at once."""
enabled = True
"""False runs the Triton kernels instead (for comparisons)."""


def available(tensor: torch.Tensor) -> bool:
    """Whether the warp kernels can run on `tensor`'s device."""
    return enabled and tensor.is_cuda and nvrtc.available()


@functools.cache
def _module(bits: int, is_float: bool, mant: int, kmask: int, ncp: int, block: int) -> nvrtc.Module:
    assert ncp <= 32 and ncp & (ncp - 1) == 0 and block % (32 * UNROLL) == 0
    defines = dict(BITS=bits, IS_FLOAT=is_float, MANT=mant, KMASK=kmask, NCP=ncp, KBITS=int(math.log2(ncp)),
                   BLOCK=block, WARPS=WARPS, UNROLL=UNROLL)
    return nvrtc.Module(Path(__file__).with_name("warp.cu").read_text(), "warp.cu", defines)


def launch(kernel: str, table, info, ncp: int, args: list) -> None:
    """Run `kernel` over every program of the chunk table `table` (elements of `info`'s
    type, `ncp` class slots); `args` precede the program count."""
    mant = info.mantissa_bits if info.is_float else 0
    kmask = (1 << info.exponent_bits) - 1
    module = _module(info.bits, info.is_float, mant, kmask, ncp, table.block)
    module.launch(kernel, -(-table.programs // WARPS), WARPS * 32, [*args, table.programs], table.base.device)
