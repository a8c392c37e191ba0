"""The stream tables of sparse chunks, written for all chunks at once with numpy and read
by one compiled walk over every chunk.

A chunk's table (docs/FORMAT.md, "Chunk layout") is LEB128 varints and codec bytes:
n_groups, then per group count, n_streams and (codec, raw length, stored length) per
stream. Sparse groups hold 0 or 4 streams."""

from dataclasses import dataclass

import numpy as np
from numba import njit

from weight_teleport.codec.cuda import layout
from weight_teleport.errors import PackFormatError

VARINT_MAX = 10
MAX_VALUE = 1 << 48
"""Larger lengths and counts are refused (no pack holds them; int64 arithmetic stays exact)."""
STREAMS = 4


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


@njit(nogil=True, cache=True)
def _varint(pack: np.ndarray, p: int, end: int) -> tuple[int, int]:
    """(value, next position) of the LEB128 varint at p that ends before `end`; value -1
    when it runs past `end`, takes more than VARINT_MAX bytes or exceeds MAX_VALUE."""
    value, shift = 0, 0
    for k in range(VARINT_MAX):
        if p + k >= end:
            return -1, end
        b = int(pack[p + k])
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (value if value <= MAX_VALUE else -1), p + k + 1
    return -1, end


@njit(nogil=True, cache=True)
def _read(pack, starts, lengths, classes, ncp, events, codec, raw, stored, at) -> int:
    """Fills the [chunks * ncp(, 4)] tables of every chunk; the first malformed chunk, or -1."""
    for i in range(starts.size):
        p, end = starts[i], starts[i] + lengths[i]
        n_groups, p = _varint(pack, p, end)
        if n_groups != classes[i]:
            return i
        for g in range(n_groups):
            row = i * ncp + g
            count, p = _varint(pack, p, end)
            n_streams, p = _varint(pack, p, end)
            if count < 0 or (n_streams != 0 and n_streams != STREAMS):
                return i
            if n_streams == 0:
                continue
            events[row] = count
            for j in range(STREAMS):
                if p >= end:
                    return i
                codec[row, j] = pack[p]
                raw[row, j], p = _varint(pack, p + 1, end)
                stored[row, j], p = _varint(pack, p, end)
                if raw[row, j] < 0 or stored[row, j] < 0:
                    return i
        for g in range(ncp):  # the streams' bytes follow the table, in order
            for j in range(STREAMS):
                at[i * ncp + g, j] = p
                p += stored[i * ncp + g, j]
        if p != end:
            return i
    return -1


def read(pack: np.ndarray, starts: np.ndarray, lengths: np.ndarray, classes: np.ndarray, ncp: int) -> StreamTable:
    """The stream tables of the sparse chunks at `starts` (`lengths` bytes) whose tensors
    have `classes` classes each; PackFormatError when one is malformed: a varint past its
    chunk or too long, another number of groups than classes, a group of other than 0 or 4
    streams, or streams that do not end the chunk exactly."""
    if (lengths <= 0).any():
        raise PackFormatError("sparse chunk is empty")
    n = starts.size
    events = np.zeros(n * ncp, np.int64)
    codec, raw, stored, at = (np.zeros((n * ncp, STREAMS), np.int64) for _ in range(4))
    bad = _read(pack, starts.astype(np.int64), lengths.astype(np.int64), classes.astype(np.int64), ncp,
                events, codec, raw, stored, at)
    if bad >= 0:
        raise PackFormatError("chunk table is truncated or malformed (sparse chunk)")
    return StreamTable(events, codec, raw, stored, at)


def _varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(LEB128 bytes of all `values` back to back, bytes of each value)."""
    v = values.astype(np.uint64)
    width = np.ones(v.size, np.int64)
    for k in range(1, VARINT_MAX):
        width += v >= np.uint64(1) << np.uint64(7 * k)
    first = layout.starts(width)
    idx = np.arange(int(width.sum())) - np.repeat(first, width)
    owner = np.repeat(np.arange(v.size), width)
    b = (v[owner] >> (7 * idx).astype(np.uint64)) & np.uint64(0x7F)
    more = idx < width[owner] - 1
    return (b | np.where(more, np.uint64(0x80), np.uint64(0))).astype(np.uint8), width


def write(n_groups: np.ndarray, events: np.ndarray, has_streams: np.ndarray, codec: np.ndarray,
          raw: np.ndarray, stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table bytes of all chunks back to back, table length of each chunk). Per chunk its
    number of groups; per [chunk, class] its events and whether it has its 4 streams; per
    [chunk, class, stream] their codec, raw and stored lengths. Classes at or past a chunk's
    number of groups are left out."""
    n, ncp = events.shape
    fields = np.zeros((n, ncp, 2 + 3 * STREAMS), np.int64)
    fields[:, :, 0] = np.where(has_streams, events, 0)
    fields[:, :, 1] = np.where(has_streams, STREAMS, 0)
    for col, arr in enumerate((codec, raw, stored)):
        fields[:, :, 2 + col::3] = arr
    keep = np.zeros(fields.shape, bool)
    keep[:, :, :2] = (np.arange(ncp)[None, :] < n_groups[:, None])[..., None]
    keep[:, :, 2:] = (keep[:, :, :1] & has_streams[..., None])
    values = np.concatenate([n_groups[:, None], fields.reshape(n, -1)], axis=1)[
        np.concatenate([np.ones((n, 1), bool), keep.reshape(n, -1)], axis=1)]
    per_chunk = 1 + keep.reshape(n, -1).sum(1)
    data, width = _varint_bytes(values)
    return data, np.add.reduceat(width, layout.starts(per_chunk)) if n else np.zeros(0, np.int64)
