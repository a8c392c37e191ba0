"""The tensor digest (codec/digest.py) on the GPU: one Triton reduction over the bytes."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda import layout
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


def digest(tensor: torch.Tensor) -> int:
    """The digest of a CUDA tensor's bytes, identical to the CPU's (synchronises)."""
    nbytes = tensor.numel() * tensor.element_size()
    return D.finish(int(word_sum(tensor).item()) & D.MASK64, nbytes)
