"""The inside of a chunk: groups of byte streams, each stream coded on its own.

    chunk  := varint n_groups, group_desc * n_groups, stream bytes (in order)
    group  := varint count, varint n_streams, stream_desc * n_streams
    stream := u8 codec id, varint raw length, varint stored length

A sparse chunk has one group per context class (count = events of that class); a dense
chunk has one group (count = elements) whose streams are byte planes.
"""

from dataclasses import dataclass

import numpy as np
from numba import njit

from weight_teleport.errors import PackFormatError

MAX_VARINT = 1 << 48
"""Counts and lengths in a chunk table are at most this (no chunk comes near it), so that
readers hold them in int64 arrays."""
VARINT_BYTES = 10
"""The most bytes a varint of a chunk table may take."""


@dataclass
class Stream:
    codec: int
    raw_len: int
    data: bytes | memoryview


@dataclass
class Group:
    count: int
    streams: list[Stream]


def _put_varint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _get_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise PackFormatError("chunk table is truncated or malformed (varint)")
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            if v > MAX_VARINT:
                raise PackFormatError(f"chunk table holds a number past {MAX_VARINT} (a count or length no chunk has)")
            return v, pos
        shift += 7


def write_table(groups: list[tuple[int, list[tuple[int, int, int]]]]) -> bytes:
    """The table of a chunk whose groups are (count, [(codec, raw length, stored length)])."""
    table = bytearray()
    _put_varint(table, len(groups))
    for count, streams in groups:
        _put_varint(table, count)
        _put_varint(table, len(streams))
        for codec, raw_len, stored in streams:
            table.append(codec)
            _put_varint(table, raw_len)
            _put_varint(table, stored)
    return bytes(table)


def write_groups(groups: list[Group]) -> bytes:
    """Serialise a chunk."""
    table = write_table([(g.count, [(s.codec, s.raw_len, len(s.data)) for s in g.streams]) for g in groups])
    return b"".join([table, *(s.data for g in groups for s in g.streams)])


def read_groups(chunk: bytes | memoryview) -> list[Group]:
    """Parse a chunk; the streams' data are views into `chunk`."""
    buf = memoryview(chunk)
    n_groups, pos = _get_varint(buf, 0)
    descs = []
    for _ in range(n_groups):
        count, pos = _get_varint(buf, pos)
        n_streams, pos = _get_varint(buf, pos)
        streams = []
        for _ in range(n_streams):
            if pos >= len(buf):
                raise PackFormatError("chunk table is truncated")
            codec = buf[pos]
            raw_len, pos = _get_varint(buf, pos + 1)
            stored, pos = _get_varint(buf, pos)
            streams.append((codec, raw_len, stored))
        descs.append((count, streams))
    groups = []
    for count, streams in descs:
        out = []
        for codec, raw_len, stored in streams:
            if pos + stored > len(buf):
                raise PackFormatError("chunk stream runs past the end of the chunk")
            out.append(Stream(codec, raw_len, buf[pos : pos + stored]))
            pos += stored
        groups.append(Group(count, out))
    if pos != len(buf):
        raise PackFormatError("chunk has trailing bytes after its streams")
    return groups


@njit(nogil=True, cache=True, inline="always")
def read_varint(pack: np.ndarray, p: int, end: int) -> tuple[int, int]:
    """`_get_varint` compiled, for walks over many chunks' tables (numba, no exceptions):
    (value, next position) of the LEB128 varint at p that ends before `end`; value -1
    when it runs past `end`, takes more than VARINT_BYTES bytes or exceeds MAX_VARINT (also
    when its value would not fit 64 bits). Inlined, with one bound per byte: the walk over
    every chunk's table is on the stage's host path, and a call and two bounds a byte made it
    several times slower."""
    value, shift, big = 0, 0, False
    stop = min(end, p + VARINT_BYTES)
    while p < stop:
        b = pack[p]
        p += 1
        if shift < 56:  # bits up to 2^63 at most: no wrap
            value |= np.int64(b & 0x7F) << shift
        elif b & 0x7F:
            big = True
        if b < 0x80:
            return (-1 if big or value > MAX_VARINT else value), p
        shift += 7
    return -1, end
