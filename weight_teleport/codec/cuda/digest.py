"""The tensor digest (codec/digest.py) on the GPU: one Triton reduction over the bytes, or
one launch over the words of many tensors (`word_sums`)."""

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda import blocks, layout
from weight_teleport.codec.cuda.bitops import term

BLOCK = 2048
TILES = 8


@triton.jit
def _digest_kernel(words_ptr, n, first_word, partial_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((), tl.uint64)
    for t in tl.static_range(TILES):
        j = (pid * TILES + t) * BLOCK + tl.arange(0, BLOCK)
        w = tl.load(words_ptr + j, mask=j < n, other=0).to(tl.uint64, bitcast=True)
        acc += tl.sum(tl.where(j < n, term(w, first_word + j), 0), axis=0)
    tl.store(partial_ptr + pid, acc.to(tl.int64, bitcast=True))


@triton.jit
def _table_digest_kernel(base_ptr, rows_ptr, prog_ptr, partial_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """Digest terms of one program's words of a chunk table over 8-byte words (blocks.py)."""
    pid = tl.program_id(0)
    c = tl.load(prog_ptr + pid).to(tl.int64)
    off, n = tl.load(rows_ptr + c * blocks.COLS + blocks.OFF), tl.load(rows_ptr + c * blocks.COLS + blocks.LEN)
    start, p0 = tl.load(rows_ptr + c * blocks.COLS + blocks.START), tl.load(rows_ptr + c * blocks.COLS + blocks.PROG0)
    acc = tl.zeros((), tl.uint64)
    for t in tl.static_range(TILES):
        j = ((pid - p0) * TILES + t) * BLOCK + tl.arange(0, BLOCK)
        w = tl.load(base_ptr + off + j, mask=j < n, other=0).to(tl.uint64, bitcast=True)
        acc += tl.sum(tl.where(j < n, term(w, start + j), 0), axis=0)
    tl.store(partial_ptr + pid, acc.to(tl.int64, bitcast=True))


def _word_sum_of_words(words: torch.Tensor, first_word: int) -> torch.Tensor:
    layout.require(words, torch.int64)
    n = words.numel()
    grid = max(1, triton.cdiv(n, BLOCK * TILES))
    partial = torch.empty(grid, dtype=torch.int64, device=words.device)
    if n:
        _digest_kernel[(grid,)](words, n, first_word, partial, BLOCK=BLOCK, TILES=TILES)
    else:
        partial.zero_()
    return partial.sum()


def word_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum (mod 2^64, as a device int64 scalar) of the digest terms of a CUDA tensor's bytes,
    in its logical (row-major) order. No host synchronisation."""
    if tensor.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=tensor.device)
    flat = tensor.detach().contiguous().view(-1)
    if flat.stride(0) != 1:  # a one-element view counts as contiguous whatever its stride
        flat = flat.clone(memory_format=torch.contiguous_format)
    u8 = flat.view(torch.uint8)
    n_full = u8.numel() // 8
    if u8.data_ptr() % 8:
        u8 = u8.clone()
    total = _word_sum_of_words(u8[:n_full * 8].view(torch.int64), 0)
    rest = u8.numel() - n_full * 8
    if rest:
        tail = torch.zeros(8, dtype=torch.uint8, device=u8.device)
        tail[:rest] = u8[n_full * 8:]
        total = total + _word_sum_of_words(tail.view(torch.int64), n_full)
    return total


def word_sums(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`word_sum` of each CUDA tensor (one device) as a device int64 tensor: one launch over
    the tensors whose bytes start on an 8-byte boundary and fill whole words (a model's
    weights, as a rule), a `word_sum` each for the others. No host synchronisation."""
    out = torch.zeros(len(tensors), dtype=torch.int64, device=tensors[0].device if tensors else "cpu")
    whole, words = [], []
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if nbytes and t.is_contiguous() and t.data_ptr() % 8 == 0 and nbytes % 8 == 0:
            whole.append(i)
            words.append(t.detach().view(-1).view(torch.uint8).view(torch.int64))
        elif nbytes:
            out[i] = word_sum(t)
    if words:
        table = blocks.build(words, 1 << 62, BLOCK * TILES)
        partial = torch.empty(table.programs, dtype=torch.int64, device=out.device)
        _table_digest_kernel[(table.programs,)](table.base, table.rows, table.program_chunk, partial,
                                                BLOCK=BLOCK, TILES=TILES)
        per = table.per_tensor(partial)
        if len(whole) == len(tensors):
            return per
        out.index_copy_(0, layout.upload(np.array(whole, np.int64), out.device), per)
    return out


def digest(tensor: torch.Tensor) -> int:
    """The digest of a CUDA tensor's bytes, identical to the CPU's (synchronises)."""
    nbytes = tensor.numel() * tensor.element_size()
    return D.finish(int(word_sum(tensor).item()) & D.MASK64, nbytes)
