"""Symbol streams as zstd frames of Huffman-coded literals, written on the GPU (huffman.cu;
codec/huffman_frames.py is the reference, byte for byte, and says why): one launch plans
every block of every stream, the frames' sizes and offsets are summed on the device, a
second launch writes the frames where the caller lays them out. Nothing waits for the
device: the host learns the sizes with the payload's."""

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
    """Every block of the streams, planned on the device (int64 tensors unless said)."""
    blocks: int
    src: torch.Tensor
    """Each block's first byte in the streams' buffer."""
    size: torch.Tensor
    """Each block's bytes (int32)."""
    stream: torch.Tensor
    """Each block's stream."""
    first: torch.Tensor
    """Index of the first block of each block's stream."""
    frame: torch.Tensor
    """The stream's length at its first block (where its frame header goes), else 0."""
    last: torch.Tensor
    """Whether the block is its stream's last (int32)."""
    header: torch.Tensor
    """Each stream's frame header bytes."""
    info: torch.Tensor
    """[blocks, INFO] int32."""
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
    size = np.minimum(lengths[stream] - k * BLOCK_BYTES, BLOCK_BYTES)
    n = stream.size
    last = np.r_[stream[1:] != stream[:-1], True][:n]
    dev = buffer.device
    src, size, stream_d, first, frame, last, header = layout.to_device(
        [offsets[stream] + k * BLOCK_BYTES, size, stream, np.arange(n) - k, np.where(k == 0, lengths[stream], 0),
         last, frame_header_size(lengths)], dev)
    info = torch.empty((max(n, 1), INFO), dtype=torch.int32, device=dev)
    codes = torch.empty(max(n, 1) * 256, dtype=torch.int16, device=dev)
    code_lengths = torch.empty(max(n, 1) * 256, dtype=torch.uint8, device=dev)
    trees = torch.empty(max(n, 1) * TREE_MAX, dtype=torch.uint8, device=dev)
    size = size.int()
    if n:
        _module().launch("huf_plan", n, THREADS, [buffer, src, size, info, codes, code_lengths, trees, n], dev)
    return Plan(n, src, size, stream_d, first, frame, last.int(), header, info, codes, code_lengths, trees)


def frame_sizes(p: Plan) -> torch.Tensor:
    """Each stream's frame bytes (device int64; no sync)."""
    return p.header.clone().index_add_(0, p.stream, 3 + p.info[:p.blocks, 1].long())


def write(buffer: torch.Tensor, p: Plan, take: torch.Tensor, at: torch.Tensor, out: torch.Tensor) -> None:
    """Writes the frames of the streams `take` (device bool) into `out` (int32 words, zero
    where the frames go), stream i's at byte at[i]; the others are left out. No sync."""
    layout.require(out, torch.int32)
    if not p.blocks:
        return
    block_bytes = 3 + p.info[:p.blocks, 1].long()
    block_at = layout.starts(block_bytes)
    keep = take[p.stream]
    block_at = torch.where(keep, at[p.stream] + p.header[p.stream] + block_at - block_at[p.first], -1)
    _module().launch("huf_write", p.blocks, THREADS, [buffer, p.src, p.size, p.info, p.codes, p.code_lengths, p.trees,
                                                      block_at, torch.where(keep, p.frame, 0), p.last, out, p.blocks],
                     buffer.device)
