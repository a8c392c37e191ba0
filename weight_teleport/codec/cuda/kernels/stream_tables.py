"""The stream tables of sparse chunks: written on the GPU (a Triton program per chunk, its
fields' varints at once), read by a compiled walk over every chunk (numba, the GIL
released).

A chunk's table (docs/FORMAT.md, "Chunk layout") is LEB128 varints and codec bytes:
n_groups, then per group count, n_streams and (codec, raw length, stored length) per
stream. Sparse groups hold 0 or 4 streams."""

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from numba import njit

from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.errors import PackFormatError
from weight_teleport.format.groups import MAX_VARINT, VARINT_BYTES, read_varint
from weight_teleport.host_memory import in_runs

VARINT_MAX = VARINT_BYTES
MAX_VALUE = MAX_VARINT
"""Larger lengths and counts are refused (no pack holds them; int64 arithmetic stays exact)."""
STREAMS = 4
GROUP_FIELDS = 2 + 3 * STREAMS
"""Varints of a group with streams in a chunk table: count, n_streams, (codec, raw, stored)
per stream."""
_VARINT_MAX, _STREAMS, _GROUP_FIELDS = tl.constexpr(VARINT_MAX), tl.constexpr(STREAMS), tl.constexpr(GROUP_FIELDS)
THREADS = min(8, os.cpu_count() or 1)
CHUNKS_A_THREAD = 4096
"""Tables of fewer chunks are read on the calling thread: starting a thread costs more than
it saves on them."""


@dataclass
class StreamTable:
    """Per segment (chunk, class; [chunks * ncp] rows, classes past a tensor's own empty)."""

    events: np.ndarray
    """Events (the group's count; 0 for a group without streams), int64."""
    codec: np.ndarray
    """[segments, 4] stream codec ids."""
    raw: np.ndarray
    """[segments, 4] raw stream lengths."""
    stored: np.ndarray
    """[segments, 4] stored lengths."""
    at: np.ndarray
    """[segments, 4] offsets of the stored bytes in the pack."""

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(events, codec, raw, stored, at), as the compiled walk takes them."""
        return self.events, self.codec, self.raw, self.stored, self.at


@njit(nogil=True, cache=True)
def _read_chunk(pack, i, start, end, n_groups_expected, ncp, events, codec, raw, stored, at) -> bool:
    """Fills chunk i's rows of the [chunks * ncp(, 4)] tables; whether it is well formed."""
    p = start
    n_groups, p = read_varint(pack, p, end)
    if n_groups != n_groups_expected:
        return False
    for g in range(n_groups):
        row = i * ncp + g
        count, p = read_varint(pack, p, end)
        n_streams, p = read_varint(pack, p, end)
        if count < 0 or (n_streams != 0 and n_streams != STREAMS):
            return False
        if n_streams == 0:
            continue
        events[row] = count
        for j in range(STREAMS):
            if p >= end:
                return False
            codec[row, j] = pack[p]
            raw[row, j], p = read_varint(pack, p + 1, end)
            stored[row, j], p = read_varint(pack, p, end)
            if raw[row, j] < 0 or stored[row, j] < 0:
                return False
    for g in range(ncp):  # the streams' bytes follow the table, in order
        for j in range(STREAMS):
            at[i * ncp + g, j] = p
            p += stored[i * ncp + g, j]
    return p == end


@njit(nogil=True, cache=True)
def _read(pack, starts, lengths, classes, ncp, lo, hi, events, codec, raw, stored, at) -> int:
    """Fills the [chunks * ncp(, 4)] tables of chunks lo..hi-1; the first malformed one, or -1."""
    for i in range(lo, hi):
        if not _read_chunk(pack, i, starts[i], starts[i] + lengths[i], classes[i], ncp, events, codec, raw, stored, at):
            return i
    return -1


def read(pack: np.ndarray, starts: np.ndarray, lengths: np.ndarray, classes: np.ndarray, ncp: int) -> StreamTable:
    """The stream tables of the sparse chunks at `starts` (`lengths` bytes) whose tensors
    have `classes` classes each; PackFormatError when one is malformed: a varint past its
    chunk or too long, another number of groups than classes, a group of other than 0 or 4
    streams, or streams that do not end the chunk exactly."""
    check_lengths(lengths)
    n, st = starts.size, empty(starts.size, ncp)
    args = (pack, starts.astype(np.int64), lengths.astype(np.int64), classes.astype(np.int64), ncp)
    bad = in_runs(n, lambda lo, hi: _read(*args, lo, hi, *st.arrays()), min(THREADS, -(-n // CHUNKS_A_THREAD)))
    check(any(b >= 0 for b in bad))
    return st


def check_lengths(lengths: np.ndarray) -> None:
    if (lengths <= 0).any():
        raise PackFormatError("sparse chunk is empty")


def check(malformed: bool) -> None:
    if malformed:
        raise PackFormatError("chunk table is truncated or malformed (sparse chunk)")


def empty(n: int, ncp: int, zeros: bool = True) -> StreamTable:
    """Tables of `n` chunks of `ncp` class slots in the thread's arena, zeroed unless not
    `zeros` (the walk must zero them then: `_read` leaves a tensor's unused slots alone).
    `at` is never zeroed: `_read` writes every slot of a chunk it reads."""
    arena = memory.arena()
    make = arena.zeros if zeros else arena.empty
    events, codec, raw, stored = make(n * ncp, np.int64), *(make((n * ncp, STREAMS), np.int64) for _ in range(3))
    return StreamTable(events, codec, raw, stored, arena.empty((n * ncp, STREAMS), np.int64))


@triton.jit
def _table_kernel(
    n_groups_ptr,
    events_ptr,
    has_ptr,
    codec_ptr,
    raw_ptr,
    stored_ptr,
    at_ptr,
    out_ptr,
    len_ptr,
    NCP: tl.constexpr,
    F: tl.constexpr,
    WRITE: tl.constexpr,
):
    """Chunk c's table as F varint fields (n_groups, then per group count, n_streams and
    (codec, raw, stored) per stream; absent ones of no bytes; a codec id is below 128, so
    its byte is its own varint): without WRITE its length into len_ptr, with WRITE its
    bytes at out_ptr + at_ptr[c]."""
    c = tl.program_id(0).to(tl.int64)
    f = tl.arange(0, F)
    ng = tl.load(n_groups_ptr + c)
    g = tl.maximum(f - 1, 0) // _GROUP_FIELDS
    k = tl.maximum(f - 1, 0) % _GROUP_FIELDS
    in_group = (f >= 1) & (g < ng)
    seg = c * NCP + g
    has = tl.load(has_ptr + seg, mask=in_group, other=0) != 0
    s = seg * _STREAMS + tl.maximum(k - 2, 0) // 3
    field = tl.maximum(k - 2, 0) % 3
    stream = in_group & has & (k >= 2)
    v = tl.load(codec_ptr + s, mask=stream & (field == 0), other=0)
    v += tl.load(raw_ptr + s, mask=stream & (field == 1), other=0)
    v += tl.load(stored_ptr + s, mask=stream & (field == 2), other=0)
    v += tl.load(events_ptr + seg, mask=in_group & has & (k == 0), other=0)
    v = tl.where(f == 0, ng, tl.where(in_group & has & (k == 1), _STREAMS, v))
    n = tl.full([F], 1, tl.int64)
    for b in tl.static_range(1, _VARINT_MAX):
        n += ((v >> (7 * b)) != 0).to(tl.int64)
    n = tl.where((f == 0) | (in_group & ((k < 2) | has)), n, 0)
    if WRITE:
        at = tl.load(at_ptr + c) + tl.cumsum(n, 0) - n
        for b in tl.static_range(_VARINT_MAX):
            byte = ((v >> (7 * b)) & 0x7F) | tl.where(b + 1 < n, 0x80, 0)
            tl.store(out_ptr + at + b, byte.to(tl.uint8), mask=b < n)
    else:
        tl.store(len_ptr + c, tl.sum(n, 0))


def max_length(ncp: int) -> int:
    """Bytes of a chunk table of `ncp` classes at most."""
    return VARINT_MAX * (1 + ncp * GROUP_FIELDS)


class Tables:
    """The chunk tables of a batch, from device tensors: per chunk its number of groups; per
    [chunk, class] its events and whether it has its 4 streams; per [chunk, class, stream]
    their codec, raw and stored lengths. Classes at or past a chunk's number of groups are
    left out of its table. The kernel's inputs are made once, for both its launches."""

    def __init__(
        self,
        n_groups: torch.Tensor,
        events: torch.Tensor,
        has_streams: torch.Tensor,
        codec: torch.Tensor,
        raw: torch.Tensor,
        stored: torch.Tensor,
    ):
        self.n, self.ncp = events.shape
        self._flat = [
            t.reshape(-1).to(d).contiguous()
            for t, d in (
                (n_groups, torch.int64),
                (events, torch.int64),
                (has_streams, torch.int8),
                (codec, torch.int64),
                (raw, torch.int64),
                (stored, torch.int64),
            )
        ]

    def _launch(self, at: torch.Tensor, out: torch.Tensor, lengths: torch.Tensor, write: bool) -> None:
        if self.n:
            _table_kernel[(self.n,)](
                *self._flat,
                at,
                out,
                lengths,
                NCP=self.ncp,
                F=triton.next_power_of_2(1 + self.ncp * GROUP_FIELDS),
                WRITE=write,
            )

    def lengths(self) -> torch.Tensor:
        """Each chunk's table bytes (int64; no sync)."""
        out = torch.zeros(self.n, dtype=torch.int64, device=self._flat[0].device)
        self._launch(out, out, out, False)
        return out

    def write(self, out: torch.Tensor, at: torch.Tensor) -> None:
        """Writes chunk i's table into the device bytes `out` at at[i] (no sync)."""
        memory.require(out, torch.uint8)
        self._launch(at.long().contiguous(), out, at, True)
