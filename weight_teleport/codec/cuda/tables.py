"""The stream tables of sparse chunks, written and read by compiled walks over every chunk
(numba, the GIL released).

A chunk's table (docs/FORMAT.md, "Chunk layout") is LEB128 varints and codec bytes:
n_groups, then per group count, n_streams and (codec, raw length, stored length) per
stream. Sparse groups hold 0 or 4 streams."""

import os
from dataclasses import dataclass

import numpy as np
from numba import njit

from weight_teleport.codec.cuda import layout
from weight_teleport.errors import PackFormatError
from weight_teleport.format.container import in_runs

VARINT_MAX = 10
MAX_VALUE = 1 << 48
"""Larger lengths and counts are refused (no pack holds them; int64 arithmetic stays exact)."""
STREAMS = 4
THREADS = min(8, os.cpu_count() or 1)
CHUNKS_A_THREAD = 4096
"""Tables of fewer chunks are read on the calling thread (a thread costs more than they take:
synthetic tables of 1895 chunks took 1.07 ms on one thread and 1.25 ms on two, development
machine)."""


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


@njit(nogil=True, cache=True, inline="always")
def _varint(pack: np.ndarray, p: int, end: int) -> tuple[int, int]:
    """(value, next position) of the LEB128 varint at p that ends before `end`; value -1
    when it runs past `end`, takes more than VARINT_MAX bytes or exceeds MAX_VALUE (also
    when its value would not fit 64 bits). Inlined, with one bound per byte: the stage's
    stream tables read three times faster than with a call and two bounds a byte (2.7 -> 0.9
    ms for 1979 chunks, development machine)."""
    value, shift, big = 0, 0, False
    stop = min(end, p + VARINT_MAX)
    while p < stop:
        b = pack[p]
        p += 1
        if shift < 56:  # bits up to 2^63 at most: no wrap
            value |= np.int64(b & 0x7F) << shift
        elif b & 0x7F:
            big = True
        if b < 0x80:
            return (-1 if big or value > MAX_VALUE else value), p
        shift += 7
    return -1, end


@njit(nogil=True, cache=True)
def _read_chunk(pack, i, start, end, n_groups_expected, ncp, events, codec, raw, stored, at) -> bool:
    """Fills chunk i's rows of the [chunks * ncp(, 4)] tables; whether it is well formed."""
    p = start
    n_groups, p = _varint(pack, p, end)
    if n_groups != n_groups_expected:
        return False
    for g in range(n_groups):
        row = i * ncp + g
        count, p = _varint(pack, p, end)
        n_streams, p = _varint(pack, p, end)
        if count < 0 or (n_streams != 0 and n_streams != STREAMS):
            return False
        if n_streams == 0:
            continue
        events[row] = count
        for j in range(STREAMS):
            if p >= end:
                return False
            codec[row, j] = pack[p]
            raw[row, j], p = _varint(pack, p + 1, end)
            stored[row, j], p = _varint(pack, p, end)
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
        if not _read_chunk(pack, i, starts[i], starts[i] + lengths[i], classes[i], ncp, events, codec, raw, stored,
                           at):
            return i
    return -1


def read(pack: np.ndarray, starts: np.ndarray, lengths: np.ndarray, classes: np.ndarray, ncp: int) -> StreamTable:
    """The stream tables of the sparse chunks at `starts` (`lengths` bytes) whose tensors
    have `classes` classes each; PackFormatError when one is malformed: a varint past its
    chunk or too long, another number of groups than classes, a group of other than 0 or 4
    streams, or streams that do not end the chunk exactly."""
    if (lengths <= 0).any():
        raise PackFormatError("sparse chunk is empty")
    n, arena = starts.size, layout.arena()
    events = arena.zeros(n * ncp, np.int64)
    codec, raw, stored, at = (arena.zeros((n * ncp, STREAMS), np.int64) for _ in range(4))
    args = (pack, starts.astype(np.int64), lengths.astype(np.int64), classes.astype(np.int64), ncp)
    bad = in_runs(n, lambda lo, hi: _read(*args, lo, hi, events, codec, raw, stored, at),
                  min(THREADS, -(-n // CHUNKS_A_THREAD)))
    if any(b >= 0 for b in bad):
        raise PackFormatError("chunk table is truncated or malformed (sparse chunk)")
    return StreamTable(events, codec, raw, stored, at)


@njit(nogil=True, cache=True)
def _put(out: np.ndarray, p: int, v: int) -> int:
    """Writes v (>= 0) as a LEB128 varint at p; the next position."""
    while v >= 0x80:
        out[p] = (v & 0x7F) | 0x80
        v >>= 7
        p += 1
    out[p] = v
    return p + 1


@njit(nogil=True, cache=True)
def _write(n_groups, events, has_streams, codec, raw, stored, out, lengths) -> int:
    """Writes every chunk's table into `out` and its length into `lengths`; the bytes written."""
    p = 0
    for i in range(n_groups.size):
        start = p
        p = _put(out, p, n_groups[i])
        for g in range(n_groups[i]):
            if not has_streams[i, g]:
                p = _put(out, _put(out, p, 0), 0)
                continue
            p = _put(out, _put(out, p, events[i, g]), STREAMS)
            for j in range(STREAMS):
                out[p] = codec[i, g, j]
                p = _put(out, _put(out, p + 1, raw[i, g, j]), stored[i, g, j])
        lengths[i] = p - start
    return p


def write(n_groups: np.ndarray, events: np.ndarray, has_streams: np.ndarray, codec: np.ndarray,
          raw: np.ndarray, stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table bytes of all chunks back to back, table length of each chunk). Per chunk its
    number of groups; per [chunk, class] its events and whether it has its 4 streams; per
    [chunk, class, stream] their codec, raw and stored lengths. Classes at or past a chunk's
    number of groups are left out."""
    n, ncp = events.shape
    out = np.empty(n * VARINT_MAX * (1 + ncp * (2 + 3 * STREAMS)), np.uint8)
    lengths = np.zeros(n, np.int64)
    i64 = lambda a: np.ascontiguousarray(a, np.int64)
    used = _write(i64(n_groups), i64(events), np.ascontiguousarray(has_streams, np.bool_), i64(codec), i64(raw),
                  i64(stored), out, lengths)
    return out[:used], lengths
