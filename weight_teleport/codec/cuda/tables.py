"""The stream tables of sparse chunks, read for all chunks at once with numpy.

A chunk's table (docs/FORMAT.md, "Chunk layout") is a run of LEB128 varints once its codec
bytes (ids < 0x80) are read as one-byte varints: n_groups, then per group count, n_streams
and (codec, raw length, stored length) per stream. Every table is decoded from a window of
its chunk that is long enough for any valid table, then walked group by group, vectorised
over chunks. Sparse groups hold 0 or 4 streams."""

from dataclasses import dataclass

import numpy as np

from weight_teleport.errors import PackFormatError

VARINT_MAX = 10
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


def _excl(a: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(a)[:-1]]).astype(np.int64)


def _varints(pack: np.ndarray, starts: np.ndarray, widths: np.ndarray):
    """(values, end byte of each varint, first varint of each window, varints per window)."""
    first = _excl(widths)
    idx = np.repeat(starts - first, widths) + np.arange(int(widths.sum()))
    b = pack[idx]
    term = b < 0x80
    term[first + widths - 1] = True
    begin = np.flatnonzero(np.concatenate([[True], term[:-1]]))
    vid = np.cumsum(term) - term
    shift = np.minimum(7 * (np.arange(b.size) - begin[vid]), 63).astype(np.uint64)
    values = np.add.reduceat((b & 0x7F).astype(np.uint64) << shift, begin)
    too_long = np.diff(np.concatenate([begin, [b.size]])) > VARINT_MAX
    values = np.where(too_long | (values > (1 << 48)), -1, values.astype(np.int64))
    ends = np.flatnonzero(term)
    ends = ends - first[np.repeat(np.arange(widths.size), widths)[ends]]
    return values, ends, vid[first], np.diff(np.concatenate([vid[first], [begin.size]]))


def read(pack: np.ndarray, starts: np.ndarray, lengths: np.ndarray, classes: np.ndarray, ncp: int) -> StreamTable:
    """The stream tables of the sparse chunks at `starts` (`lengths` bytes) whose tensors
    have `classes` classes each; PackFormatError when one is malformed."""
    widths = np.minimum(lengths, 1 + VARINT_MAX * (1 + classes * (2 + 3 * STREAMS)))
    if (widths <= 0).any():
        raise PackFormatError("sparse chunk is empty")
    v, ends, v0, nv = _varints(pack, starts, widths)
    n = starts.size
    last = v0 + nv - 1
    bad = v[v0] != classes
    pos = v0 + 1
    shape = (n, ncp, STREAMS)
    events = np.zeros((n, ncp), np.int64)
    codec, raw, stored = (np.zeros(shape, np.int64) for _ in range(3))
    for g in range(int(classes.max())):
        on = g < classes
        cnt, ns = v[np.minimum(pos, last)], v[np.minimum(pos + 1, last)]
        bad |= on & ((ns != 0) & (ns != STREAMS) | (pos + 1 + 3 * ns > last))
        four = on & (ns == STREAMS)
        events[:, g] = np.where(four, cnt, 0)
        for j in range(STREAMS):
            for col, arr in zip(range(3), (codec, raw, stored)):
                arr[:, g, j] = np.where(four, v[np.minimum(pos + 2 + 3 * j + col, last)], 0)
        pos = np.where(on, pos + 2 + 3 * np.where(four, ns, 0), pos)
    table_len = ends[np.minimum(pos - 1, last)] + 1
    bad |= (pos - 1 > last) | (table_len + stored.sum((1, 2)) != lengths)
    bad |= (raw < 0).any((1, 2)) | (stored < 0).any((1, 2)) | (events < 0).any(1)
    if bad.any():
        raise PackFormatError("chunk table is truncated or malformed (sparse chunk)")
    flat = stored.reshape(n, -1)
    at = (starts + table_len)[:, None] + np.cumsum(flat, 1) - flat
    rows = lambda a: a.reshape(n * ncp, STREAMS)
    return StreamTable(events.reshape(-1), rows(codec), rows(raw), rows(stored), rows(at.reshape(shape)))
