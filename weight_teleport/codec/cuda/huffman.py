"""Symbol streams as zstd frames of Huffman-coded literals, written on the GPU (huffman.cu;
codec/huffman_frames.py is the reference, byte for byte, and says why): one launch plans
every block of every stream, the host reads the blocks' sizes (the caller's one sync) and
lays the frames out, a second launch writes them."""

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from weight_teleport.codec.cuda import layout, nvrtc
from weight_teleport.codec.huffman_frames import BLOCK_BYTES, frame_header_size

SOURCE = Path(__file__).with_name("huffman.cu")
THREADS = 256
INFO = 8
"""Ints per block in the plan: kind (raw, RLE, compressed), content bytes, four stream bytes,
tree description bytes, longest code."""
TREE_MAX = 128
"""Bytes of a block's tree description at most (huffman.cu)."""


def available(tensor: torch.Tensor) -> bool:
    """Whether the writer can run on `tensor`'s device (NVRTC compiles for it)."""
    return nvrtc.compiles_for(tensor)


@functools.cache
def _module() -> nvrtc.Module:
    return nvrtc.Module(SOURCE.read_text(), SOURCE.name, {})


@dataclass
class Plan:
    """Every block of the streams, planned on the device."""
    lengths: np.ndarray
    """Each stream's length."""
    stream: np.ndarray
    """Each block's stream."""
    src: torch.Tensor
    """Each block's first byte in the streams' buffer (device, int64)."""
    size: torch.Tensor
    """Each block's bytes (device, int32)."""
    info: torch.Tensor
    """[blocks, INFO] int32 (device; the caller fetches it)."""
    codes: torch.Tensor
    """[blocks * 256] code of each symbol (device scratch for the write)."""
    code_lengths: torch.Tensor
    """[blocks * 256] code length of each symbol (0: absent)."""
    trees: torch.Tensor
    """[blocks * TREE_MAX] each block's tree description."""


def plan(buffer: torch.Tensor, offsets: np.ndarray, lengths: np.ndarray) -> Plan:
    """Launch the planning of the streams buffer[offsets[i]:offsets[i] + lengths[i]] (each at
    least one byte); nothing syncs."""
    layout.require(buffer, torch.uint8)
    stream, k = layout.items(-(-lengths // BLOCK_BYTES))
    src = offsets[stream] + k * BLOCK_BYTES
    size = np.minimum(lengths[stream] - k * BLOCK_BYTES, BLOCK_BYTES)
    dev = buffer.device
    src_d, size_d = layout.to_device([src, size], dev)
    size_d = size_d.int()
    n = stream.size
    info = torch.empty((max(n, 1), INFO), dtype=torch.int32, device=dev)
    codes = torch.empty(max(n, 1) * 256, dtype=torch.int16, device=dev)
    code_lengths = torch.empty(max(n, 1) * 256, dtype=torch.uint8, device=dev)
    trees = torch.empty(max(n, 1) * TREE_MAX, dtype=torch.uint8, device=dev)
    if n:
        _module().launch("huf_plan", n, THREADS, [buffer, src_d, size_d, info, codes, code_lengths, trees, n], dev)
    return Plan(lengths, stream, src_d, size_d, info, codes, code_lengths, trees)


def frame_sizes(p: Plan, info: np.ndarray) -> np.ndarray:
    """Each stream's frame bytes, from the fetched plan."""
    block_bytes = 3 + info[:p.stream.size, 1].astype(np.int64)
    return frame_header_size(p.lengths) + np.bincount(p.stream, block_bytes, p.lengths.size).astype(np.int64)


def write(buffer: torch.Tensor, p: Plan, info: np.ndarray, take: np.ndarray, sizes: np.ndarray):
    """(device bytes of the frames of the streams `take`, end to end; each one's offset)."""
    dev = buffer.device
    out_off = layout.starts(sizes[take])
    total = int(sizes[take].sum())
    out = torch.zeros(-(-max(total, 1) // 4), dtype=torch.int32, device=dev)
    n = p.stream.size
    if n and total:
        block_bytes = 3 + info[:n, 1].astype(np.int64)
        first = np.r_[True, p.stream[1:] != p.stream[:-1]]
        is_last = np.r_[p.stream[1:] != p.stream[:-1], True]
        stream_at = np.full(p.lengths.size, -1, np.int64)
        stream_at[take] = out_off + frame_header_size(p.lengths[take])
        block_at = layout.starts(block_bytes)
        within = block_at - block_at[first][np.cumsum(first) - 1]
        at = np.where(take[p.stream], stream_at[p.stream] + within, -1)
        frame = np.where(first & take[p.stream], p.lengths[p.stream], 0)
        at_d, frame_d, last_d = layout.to_device([at, frame, is_last], dev)
        _module().launch("huf_write", n, THREADS, [buffer, p.src, p.size, p.info, p.codes, p.code_lengths, p.trees,
                                                   at_d, frame_d, last_d.int(), out, n], dev)
    return out.view(torch.uint8)[:total], out_off
