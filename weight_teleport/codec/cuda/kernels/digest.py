"""The tensor digest (codec/digest.py) on the GPU: one Triton launch over the 8-byte words of
one tensor or of many (`word_sums`)."""

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda.kernels import chunk_table
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.bitops import term
from weight_teleport.codec.dtypes import contiguous

BLOCK = 2048
TILES = 8


@triton.jit
def _digest_kernel(base_ptr, rows_ptr, prog_ptr, partial_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """Digest terms of one program's words of a chunk table over 8-byte words (chunk_table.py)."""
    pid = tl.program_id(0)
    c = tl.load(prog_ptr + pid).to(tl.int64)
    off = tl.load(rows_ptr + c * chunk_table.COLS + chunk_table.OFF)
    n = tl.load(rows_ptr + c * chunk_table.COLS + chunk_table.LEN)
    start = tl.load(rows_ptr + c * chunk_table.COLS + chunk_table.START)
    p0 = tl.load(rows_ptr + c * chunk_table.COLS + chunk_table.PROG0)
    acc = tl.zeros((), tl.uint64)
    for t in tl.static_range(TILES):
        j = ((pid - p0) * TILES + t) * BLOCK + tl.arange(0, BLOCK)
        w = tl.load(base_ptr + off + j, mask=j < n, other=0).to(tl.uint64, bitcast=True)
        acc += tl.sum(tl.where(j < n, term(w, start + j), 0), axis=0)
    tl.store(partial_ptr + pid, acc.to(tl.int64, bitcast=True))


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes in logical (row-major) order as int64 words from an 8-byte boundary,
    the last one zero-padded: a view where they already are (a model's weights, as a rule),
    else a copy."""
    flat = contiguous(tensor).view(-1)
    if flat.stride(0) != 1:  # a one-element view counts as contiguous whatever its stride
        flat = flat.clone(memory_format=torch.contiguous_format)
    u8 = flat.view(torch.uint8)
    if u8.data_ptr() % 8 == 0 and u8.numel() % 8 == 0:
        return u8.view(torch.int64)
    padded = torch.zeros(-(-u8.numel() // 8) * 8, dtype=torch.uint8, device=u8.device)
    padded[: u8.numel()] = u8
    return padded.view(torch.int64)


def word_sums(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum (mod 2^64) of the digest terms of each CUDA tensor's bytes (one device), as a device
    int64 tensor, in one launch over a chunk table of their words. No host synchronisation."""
    out = torch.zeros(len(tensors), dtype=torch.int64, device=tensors[0].device if tensors else "cpu")
    keep = [i for i, t in enumerate(tensors) if t.numel()]
    if not keep:
        return out
    words = [_words(tensors[i]) for i in keep]  # alive until the launch: the table holds addresses
    table = chunk_table.build(words, 1 << 62, BLOCK * TILES)
    partial = torch.empty(table.programs, dtype=torch.int64, device=out.device)
    _digest_kernel[(table.programs,)](table.base, table.rows, table.program_chunk, partial, BLOCK=BLOCK, TILES=TILES)
    per = table.per_tensor(partial)
    if len(keep) == len(tensors):
        return per
    return out.index_copy_(0, memory.upload(np.array(keep, np.int64), out.device), per)


def word_sum(tensor: torch.Tensor) -> torch.Tensor:
    """`word_sums` of one tensor, a device int64 scalar."""
    return word_sums([tensor])[0]


def digest(tensor: torch.Tensor) -> int:
    """The digest of a CUDA tensor's bytes, identical to the CPU's (synchronises)."""
    nbytes = tensor.numel() * tensor.element_size()
    return D.finish(int(word_sum(tensor).item()) & D.MASK64, nbytes)
