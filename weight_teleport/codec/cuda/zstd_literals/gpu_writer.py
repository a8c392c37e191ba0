"""Symbol streams as zstd frames of Huffman-coded literals, written on the GPU (huffman.cu;
codec/cuda/zstd_literals/reference.py is the reference, byte for byte, and says why): one launch plans
every block of every stream, the frames' sizes and offsets are summed on the device, a
second launch writes the frames where the caller lays them out. Nothing waits for the
device: the host learns the sizes with the payload's."""

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from weight_teleport.codec.cuda.runtime import memory, nvrtc
from weight_teleport.codec.cuda.zstd_literals.reference import BLOCK_BYTES, frame_header_size

SOURCE = Path(__file__).with_name("huffman.cu")
THREADS = 256
"""Threads of a huf_write CTA (huffman.cu's WRITE_THREADS)."""
PLAN_WARPS = 2
"""Warps of a huf_plan CTA, a block each."""
INFO = 8
"""Ints per block in the plan: kind (raw, RLE, compressed), content bytes, four stream bytes,
tree description bytes, longest code."""
TREE_MAX = 128
"""Bytes of a block's tree description at most (huffman.cu)."""


def available(tensor: torch.Tensor) -> bool:
    """Whether the writer can run on `tensor`'s device: one that NVRTC compiles for, with
    __match_any_sync (compute capability 7.0 on)."""
    return nvrtc.compiles_for(tensor) and nvrtc.capability(tensor.device) >= 70


@functools.cache
def _module() -> nvrtc.Module:
    return nvrtc.Module(SOURCE.read_text(), SOURCE.name, {"WRITE_THREADS": THREADS, "PLAN_WARPS": PLAN_WARPS})


@dataclass
class Blocks:
    """The blocks of the streams at least min_length bytes long, then empty ones up to the
    launch's bound (int64 device tensors)."""

    src: torch.Tensor
    """Each block's first byte in the streams' buffer."""
    size: torch.Tensor
    """Its bytes (0: an empty block)."""
    stream: torch.Tensor
    """Its stream (the number of streams: an empty block)."""
    first: torch.Tensor
    """The index of its stream's first block."""
    frame: torch.Tensor
    """The stream's length at its first block (where the frame header goes), else 0."""
    last: torch.Tensor
    """1 where it is its stream's last block."""
    header: torch.Tensor
    """Each stream's frame header bytes, then one for the empty blocks' stream."""


@dataclass
class Plan:
    """Every block of the streams, planned on the device."""

    n: int
    """Blocks of the launch."""
    blocks: Blocks
    size: torch.Tensor
    """Each block's bytes (int32)."""
    info: torch.Tensor
    """[blocks, INFO] int32 (zeros for an empty block)."""
    codes: torch.Tensor
    """[blocks * 256] code of each symbol (device scratch for the write)."""
    code_lengths: torch.Tensor
    """[blocks * 256] code length of each symbol (0: absent)."""
    trees: torch.Tensor
    """[blocks * TREE_MAX] each block's tree description."""


def blocks(offsets: torch.Tensor, lengths: torch.Tensor, min_length: int, max_blocks: int) -> Blocks:
    """The BLOCK_BYTES blocks of the streams [offsets[i], +lengths[i]) at least `min_length`
    (>= 1) bytes long, in stream order, then empty ones up to `max_blocks` (at least their
    number). No sync."""
    n = lengths.numel()
    lengths = torch.cat([lengths.reshape(-1), lengths.new_zeros(1)])  # stream n: the empty blocks'
    offsets = torch.cat([offsets.reshape(-1), offsets.new_zeros(1)])
    count = torch.where(lengths >= min_length, (lengths + BLOCK_BYTES - 1) // BLOCK_BYTES, 0)
    ends = count.cumsum(0)
    b = torch.arange(max_blocks, device=lengths.device)
    stream = torch.searchsorted(ends[:n], b, right=True)
    k = b - (ends - count)[stream]
    return Blocks(
        offsets[stream] + k * BLOCK_BYTES,
        torch.where(stream < n, torch.clamp(lengths[stream] - k * BLOCK_BYTES, max=BLOCK_BYTES), 0),
        stream,
        b - k,
        torch.where(k == 0, lengths[stream], 0),
        (k == count[stream] - 1).long(),
        frame_header_size(lengths),
    )


def plan(buffer: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, min_length: int, max_blocks: int) -> Plan:
    """Launch the planning of the streams buffer[offsets[i]:offsets[i] + lengths[i]] (device
    int64) at least `min_length` (>= 1) bytes long, the others left out; `max_blocks` (at
    least their blocks) sizes the launch, its blocks past theirs empty. Nothing syncs."""
    memory.require(buffer, torch.uint8)
    dev = buffer.device
    bl = blocks(offsets, lengths, min_length, max_blocks)
    n = max(max_blocks, 1)
    info = torch.empty((n, INFO), dtype=torch.int32, device=dev)
    codes = torch.empty(n * 256, dtype=torch.int16, device=dev)
    code_lengths = torch.empty(n * 256, dtype=torch.uint8, device=dev)
    trees = torch.empty(n * TREE_MAX, dtype=torch.uint8, device=dev)
    size = bl.size.int()
    if max_blocks:
        _module().launch(
            "huf_plan",
            -(-max_blocks // PLAN_WARPS),
            32 * PLAN_WARPS,
            [buffer, bl.src, size, info, codes, code_lengths, trees, max_blocks],
            dev,
        )
    return Plan(max_blocks, bl, size, info, codes, code_lengths, trees)


def frame_sizes(p: Plan) -> torch.Tensor:
    """Each stream's frame bytes (device int64; no sync); those of streams left out are
    meaningless."""
    sizes = p.blocks.header.clone().index_add_(0, p.blocks.stream, 3 + p.info[: p.n, 1].long())
    return sizes[:-1]


def write(buffer: torch.Tensor, p: Plan, take: torch.Tensor, at: torch.Tensor, out: torch.Tensor) -> None:
    """Writes the frames of the streams `take` (device bool) into `out` (int32 words, zero
    where the frames go), stream i's at byte at[i]; the others are left out. No sync."""
    memory.require(out, torch.int32)
    if not p.n:
        return
    bl = p.blocks
    block_at = memory.starts(3 + p.info[: p.n, 1].long())
    keep = torch.cat([take.reshape(-1), take.new_zeros(1)])[bl.stream]
    at = torch.cat([at.reshape(-1), at.new_zeros(1)])[bl.stream]
    block_at = torch.where(keep, at + bl.header[bl.stream] + block_at - block_at[bl.first], -1)
    _module().launch(
        "huf_write",
        p.n,
        THREADS,
        [
            buffer,
            bl.src,
            p.size,
            p.info,
            p.codes,
            p.code_lengths,
            p.trees,
            block_at,
            torch.where(keep, bl.frame, 0),
            bl.last.int(),
            out,
            p.n,
        ],
        buffer.device,
    )
