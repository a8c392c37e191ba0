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
def _module(defines: tuple) -> nvrtc.Module:
    return nvrtc.Module(Path(__file__).with_name("warp.cu").read_text(), "warp.cu", dict(defines))


def _defines(info, block: int, **extra) -> tuple:
    assert block % (32 * UNROLL) == 0 and UNROLL % max(1, 64 // info.bits) == 0
    mant = info.mantissa_bits if info.is_float else 0
    base = dict(BITS=info.bits, IS_FLOAT=info.is_float, MANT=mant, KMASK=(1 << info.exponent_bits) - 1,
                BLOCK=block, WARPS=WARPS, UNROLL=UNROLL)
    return tuple(sorted({**base, **extra}.items()))


def launch(kernel: str, table, info, ncp: int, args: list) -> None:
    """Run a rank kernel over every program of the chunk table `table` (elements of
    `info`'s type, `ncp` class slots), a warp per program; `args` precede the program count."""
    assert ncp <= 32 and ncp & (ncp - 1) == 0
    module = _module(_defines(info, table.block, NCP=ncp, KBITS=int(math.log2(ncp))))
    module.launch(kernel, -(-table.programs // WARPS), WARPS * 32, [*args, table.programs], table.base.device)


def scan(table, info, nb: int, args: list) -> None:
    """Run the scan kernel over every program of `table`, a CTA per program, with `nb`
    histogram bins; `args` precede the program count."""
    assert nb & (nb - 1) == 0
    module = _module(_defines(info, table.block, NB=nb, HBITS=int(math.log2(nb))))
    module.launch("scan_words", table.programs, WARPS * 32, [*args, table.programs], table.base.device)
