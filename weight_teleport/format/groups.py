"""The inside of a chunk: groups of byte streams, each stream coded on its own.

    chunk  := varint n_groups, group_desc * n_groups, stream bytes (in order)
    group  := varint count, varint n_streams, stream_desc * n_streams
    stream := u8 codec id, varint raw length, varint stored length

A sparse chunk has one group per context class (count = events of that class); a dense
chunk has one group (count = elements) whose streams are byte planes.
"""

from dataclasses import dataclass

from weight_teleport.errors import PackFormatError

MAX_VARINT = 1 << 48
"""Counts and lengths in a chunk table are at most this (no chunk comes near it), so that
readers hold them in int64 arrays."""


@dataclass
class Stream:
    codec: int
    raw_len: int
    data: bytes | memoryview


@dataclass
class Group:
    count: int
    streams: list[Stream]


def put_varint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def get_varint(buf: memoryview, pos: int) -> tuple[int, int]:
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
    put_varint(table, len(groups))
    for count, streams in groups:
        put_varint(table, count)
        put_varint(table, len(streams))
        for codec, raw_len, stored in streams:
            table.append(codec)
            put_varint(table, raw_len)
            put_varint(table, stored)
    return bytes(table)


def write_groups(groups: list[Group]) -> bytes:
    """Serialise a chunk."""
    table = write_table([(g.count, [(s.codec, s.raw_len, len(s.data)) for s in g.streams]) for g in groups])
    return b"".join([table, *(s.data for g in groups for s in g.streams)])


def read_groups(chunk: bytes | memoryview) -> list[Group]:
    """Parse a chunk; the streams' data are views into `chunk`."""
    buf = memoryview(chunk)
    n_groups, pos = get_varint(buf, 0)
    descs = []
    for _ in range(n_groups):
        count, pos = get_varint(buf, pos)
        n_streams, pos = get_varint(buf, pos)
        streams = []
        for _ in range(n_streams):
            if pos >= len(buf):
                raise PackFormatError("chunk table is truncated")
            codec = buf[pos]
            raw_len, pos = get_varint(buf, pos + 1)
            stored, pos = get_varint(buf, pos)
            streams.append((codec, raw_len, stored))
        descs.append((count, streams))
    groups = []
    for count, streams in descs:
        out = []
        for codec, raw_len, stored in streams:
            if pos + stored > len(buf):
                raise PackFormatError("chunk stream runs past the end of the chunk")
            out.append(Stream(codec, raw_len, buf[pos:pos + stored]))
            pos += stored
        groups.append(Group(count, out))
    if pos != len(buf):
        raise PackFormatError("chunk has trailing bytes after its streams")
    return groups
