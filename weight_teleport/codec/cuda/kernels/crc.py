"""CRC-32 (zlib's) of many byte ranges of one device buffer, in one launch: the chunks of a
pack checked on the GPU (the encoder's before its payload is copied to the host, the stage's
from the uploaded pack).

A range is cut into pieces; each lane runs the CRC of one piece, then moves it to its place
in the range by multiplying with x^(8 * bytes after it) modulo the polynomial (zlib's
crc32_combine), and the range's CRC is the XOR of its pieces' terms (an atomic XOR). On
NVIDIA GPUs the CUDA C kernel crc.cu does it eight bytes a step (slicing-by-8 tables in
shared memory); the Triton kernel here, a byte a step, runs under Triton's CPU interpreter
and where NVRTC cannot be loaded."""

import functools
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.runtime import memory, nvrtc

POLY = 0xEDB88320
"""The CRC-32 polynomial, bit-reflected."""
PIECE_BITS = 8
PIECE = 1 << PIECE_BITS
"""Bytes of one lane's piece."""
LANES = 128
"""Pieces of one program (all of one range)."""
SOURCE = Path(__file__).with_name("crc.cu")
"""The CUDA C kernel (tests/codec/test_codec_warp_compile.py compiles it without a GPU)."""
C_PIECE = 2048
"""Bytes of one lane's piece in the CUDA C kernel, counted from the range's start."""


def _mulmod_host(a: int, b: int) -> int:
    """a * b modulo the polynomial, reflected (zlib's multmodp)."""
    p = 0
    for i in range(32):
        if a >> (31 - i) & 1:
            p ^= b
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return p


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(byte table of the CRC, x^(2^k) modulo the polynomial for k < 32), as int64."""
    table = np.arange(256, dtype=np.int64)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ POLY, table >> 1)
    x2n, p = [], 1 << 30  # x^1
    for _ in range(32):
        x2n.append(p)
        p = _mulmod_host(p, p)
    return table, np.array(x2n, np.int64)


def _slicing(table: np.ndarray) -> np.ndarray:
    """[8, 256]: the slicing-by-8 tables (table k: the CRC of a byte followed by k zero bytes)."""
    out = [table]
    for _ in range(7):
        out.append((out[-1] >> 8) ^ table[out[-1] & 0xFF])
    return np.stack(out)


@functools.cache
def _device_tables(device: torch.device, slicing: bool = False) -> torch.Tensor:
    table, x2n = _tables()
    rows = _slicing(table).ravel() if slicing else table
    return torch.from_numpy(np.concatenate([rows, x2n]).astype(np.uint32).view(np.int32)).to(device)


@functools.cache
def _module() -> nvrtc.Module:
    return nvrtc.Module(SOURCE.read_text(), SOURCE.name, {"PIECE": C_PIECE})


@triton.jit
def _mulmod(a, b):
    """a * b modulo the polynomial (uint32 bit patterns, reflected; a may be a scalar)."""
    p = b ^ b
    for i in tl.static_range(32):
        p = tl.where(((a >> (31 - i)) & 1) != 0, p ^ b, p)
        b = tl.where((b & 1) != 0, (b >> 1) ^ 0xEDB88320, b >> 1)
    return p


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _crc_kernel(
    data_ptr,
    tables_ptr,
    progs_ptr,
    ranges_ptr,
    out_ptr,
    SHIFT_BITS: tl.constexpr,
    PIECE: tl.constexpr,
    PIECE_BITS: tl.constexpr,
    LANES: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    r, first = tl.load(progs_ptr + pid * 2), tl.load(progs_ptr + pid * 2 + 1)
    start, length = tl.load(ranges_ptr + r * 2), tl.load(ranges_ptr + r * 2 + 1)
    n_pieces = (length + PIECE - 1) // PIECE
    j = first + tl.arange(0, LANES).to(tl.int64)
    live = j < n_pieces
    after = n_pieces - 1 - j
    window = start + length - (after + 1) * PIECE  # may begin before the range: its first piece
    crc = tl.full([LANES], 0xFFFFFFFF, tl.uint32)
    for i in range(PIECE):
        at = window + i
        inside = live & (at >= start)
        byte = tl.load(data_ptr + at, mask=inside, other=0).to(tl.uint32)
        t = tl.load(tables_ptr + ((crc ^ byte) & 0xFF)).to(tl.uint32, bitcast=True)
        crc = tl.where(inside, t ^ (crc >> 8), crc)
    crc = crc ^ 0xFFFFFFFF
    shift = tl.full([LANES], 0x80000000, tl.uint32)  # x^0
    for k in range(SHIFT_BITS):
        x2n = tl.load(tables_ptr + 256 + ((k + PIECE_BITS + 3) % 32)).to(tl.uint32, bitcast=True)
        shift = tl.where(((after >> k) & 1) != 0, _mulmod(x2n, shift), shift)
    term = tl.where(live, _mulmod(shift, crc), 0)
    tl.atomic_xor(out_ptr + r, tl.reduce(term, 0, _xor).to(tl.int32, bitcast=True), sem="relaxed")


def crc32(data: torch.Tensor, offsets, lengths, bounds: np.ndarray | None = None) -> torch.Tensor:
    """[ranges] int32: the CRC-32 (zlib.crc32 as a signed 32-bit pattern) of every range
    data[offsets[i]:offsets[i] + lengths[i]] of a device byte buffer. The ranges are host
    arrays, or device tensors with host `bounds` (each range's length at most) sizing the
    launch. No sync."""
    memory.require(data, torch.uint8)
    if isinstance(offsets, torch.Tensor):
        ranges = torch.stack([offsets, lengths], 1).long()
    else:
        offsets, lengths = np.asarray(offsets, np.int64), np.asarray(lengths, np.int64)
        assert ((offsets >= 0) & (lengths >= 0) & (offsets + lengths <= data.numel())).all()
        ranges, bounds = None, lengths
    out = torch.zeros(len(offsets), dtype=torch.int32, device=data.device)
    fast = nvrtc.compiles_for(data)
    pieces = -(-np.asarray(bounds, np.int64) // (C_PIECE if fast else PIECE))
    owner, k = memory.items(-(-pieces // LANES))
    if not owner.size:
        return out
    host_progs = np.stack([owner, k * LANES], 1)
    progs: torch.Tensor
    if ranges is None:
        progs, ranges = memory.to_device([host_progs, np.stack([offsets, lengths], 1)], data.device)
    else:
        progs = memory.upload(host_progs, data.device)
    if fast:
        _module().launch(
            "crc_ranges",
            owner.size,
            LANES,
            [data, _device_tables(data.device, True), progs, ranges, out, owner.size],
            data.device,
        )
        return out
    shift_bits = max(1, int(pieces.max() - 1).bit_length())
    _crc_kernel[(owner.size,)](
        data,
        _device_tables(data.device),
        progs,
        ranges,
        out,
        SHIFT_BITS=shift_bits,
        PIECE=PIECE,
        PIECE_BITS=PIECE_BITS,
        LANES=LANES,
    )
    return out
