"""The stream tables of sparse chunks, written and read for all chunks at once with numpy.

A chunk's table (docs/FORMAT.md, "Chunk layout") is a run of LEB128 varints once its codec
bytes (ids < 0x80) are read as one-byte varints: n_groups, then per group count, n_streams
and (codec, raw length, stored length) per stream. Every table is decoded from a window of
its chunk that is long enough for any valid table, then walked group by group, vectorised
over chunks. Sparse groups hold 0 or 4 streams."""

from dataclasses import dataclass

import numpy as np

from weight_teleport.codec.cuda import layout
from weight_teleport.errors import PackFormatError

VARINT_MAX = 10
TYPICAL_BYTES = 4
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


def _varints(pack: np.ndarray, starts: np.ndarray, widths: np.ndarray):
    """(values, end byte of each varint, first varint of each window, varints per window)."""
    first = layout.starts(widths)
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


def _parse(pack: np.ndarray, starts: np.ndarray, lengths: np.ndarray, classes: np.ndarray, ncp: int,
           widths: np.ndarray) -> tuple[StreamTable, np.ndarray]:
    """(stream tables, per chunk whether its table is malformed or not within `widths` bytes)."""
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
    flat = stored.reshape(n, -1)
    at = (starts + table_len)[:, None] + np.cumsum(flat, 1) - flat
    rows = lambda a: a.reshape(n * ncp, STREAMS)
    return StreamTable(events.reshape(-1), rows(codec), rows(raw), rows(stored), rows(at.reshape(shape))), bad


def read(pack: np.ndarray, starts: np.ndarray, lengths: np.ndarray, classes: np.ndarray, ncp: int) -> StreamTable:
    """The stream tables of the sparse chunks at `starts` (`lengths` bytes) whose tensors
    have `classes` classes each; PackFormatError when one is malformed. Tables are first
    read from windows that fit values below 2^28 (TYPICAL_BYTES a varint); chunks whose
    table does not parse in its window are read again from one that fits any valid table."""
    if (lengths <= 0).any():
        raise PackFormatError("sparse chunk is empty")
    full = np.minimum(lengths, 1 + VARINT_MAX * (1 + classes * (2 + 3 * STREAMS)))
    table, bad = _parse(pack, starts, lengths, classes, ncp,
                        np.minimum(full, 1 + TYPICAL_BYTES * (1 + classes * (2 + 3 * STREAMS))))
    if bad.any():
        redo = np.flatnonzero(bad)
        again, still = _parse(pack, starts[redo], lengths[redo], classes[redo], ncp, full[redo])
        if still.any():
            raise PackFormatError("chunk table is truncated or malformed (sparse chunk)")
        for name in ("events", "codec", "raw", "stored", "at"):
            rows = getattr(table, name).reshape(starts.size, ncp, -1)
            rows[redo] = getattr(again, name).reshape(redo.size, ncp, -1)
    return table


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
