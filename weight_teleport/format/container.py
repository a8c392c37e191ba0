"""Pack container (versions 1 and 2): a fixed preamble, a JSON header, then the chunk payload.

    offset  size  field
    0       4     magic b"WTPK"
    4       2     format version, u16 little-endian
    6       2     flags, u16: bit 0 = the header is zstd-compressed; other bits 0
    8       4     header length H (as stored), u32
    12      4     CRC-32 of the stored header bytes, u32
    16      8     payload length P, u64
    24      H     header: UTF-8 JSON object
    24+H    P     payload: the chunks, back to back

Every chunk is addressed by (offset, length) relative to the payload start and carries
its own CRC-32, so a reader can fetch the preamble and header, then any chunk alone.
"""

import struct
import zlib
from dataclasses import dataclass

import msgspec
import numpy as np

import zstandard

from weight_teleport.errors import PackFormatError, UnsupportedFormatError
from weight_teleport.host_memory import collections_paused, fill, in_runs, join
from weight_teleport.format import zstd
from weight_teleport.format.checks import check_layout
from weight_teleport.format.header import FORMAT_VERSION, ChunkRef, PackHeader, TensorRecord
from weight_teleport.format.limits import DEFAULT_LIMITS, PackLimits, header_bytes_allowed, over_limit

PackBuffer = bytes | memoryview | np.ndarray
"""A pack in memory: bytes, a memoryview of them, or a uint8 array (`codec.pinned_pack`,
a fetch into pinned memory)."""

MAGIC = b"WTPK"
READ_VERSIONS = (1, 2)
"""Container versions this build reads (it writes FORMAT_VERSION, format/header.py)."""
PREAMBLE = struct.Struct("<4sHHIIQ")
FLAG_HEADER_ZSTD = 1
COMPRESS_HEADER_FROM = 4096
"""Headers of at least this many bytes are stored zstd-compressed when that is smaller and
within the expansion a reader accepts (limits.header_bytes_allowed)."""


class _Header(msgspec.Struct):
    """The header's JSON object as it is read: msgspec parses it straight into the records
    and checks every field's type on the way, with no `json` objects and no walk over
    them."""

    kind: str
    version: int
    base_version: int | None
    chunk_elems: int
    stream_codecs: list[str]
    tensors: list[TensorRecord]


_decode_header = msgspec.json.Decoder(_Header).decode
_encode_json = msgspec.json.Encoder().encode


_V2_FIELDS = ("box", "order", "cuts", "chunk_digests", "chunk_base_digests")


def pack_version(records) -> int:
    """The container version a pack of `records` is written as: 2 where any record uses a
    field of version 2, else 1 (whole-tensor packs keep their version 1 bytes)."""
    return FORMAT_VERSION if any(t.is_v2 for t in records) else 1


def _header_json(h: PackHeader) -> bytes:
    """Compact JSON; fields at their defaults are left out."""
    tensors = []
    for t in h.tensors:
        rec = {
            "name": t.name,
            "dtype": t.dtype,
            "shape": t.shape,
            "codec": t.codec,
            "digest": t.digest,
            "changed": t.changed,
        }
        if t.base_digest is not None:
            rec["base_digest"] = t.base_digest
        if t.classes:
            rec["classes"] = t.classes
        if t.inverted:
            rec["inverted"] = t.inverted
        if t.chunks:
            rec["chunks"] = t.chunks
        for name in _V2_FIELDS:
            value = getattr(t, name)
            if value is not None and value != []:
                rec[name] = value
        tensors.append(rec)
    obj = {
        "kind": h.kind,
        "version": h.version,
        "base_version": h.base_version,
        "chunk_elems": h.chunk_elems,
        "stream_codecs": h.stream_codecs,
        "tensors": tensors,
    }
    return _encode_json(obj)


def _prefix(header: PackHeader, payload_len: int) -> bytes:
    """The preamble and the stored header of a pack whose payload has `payload_len` bytes."""
    with collections_paused():
        head = _header_json(header)
    flags = 0
    if len(head) >= COMPRESS_HEADER_FROM:
        packed = zstandard.ZstdCompressor(level=1, write_checksum=False).compress(head)
        if len(packed) < len(head) and len(head) <= header_bytes_allowed(len(packed)):
            head, flags = packed, FLAG_HEADER_ZSTD
    version = pack_version(header.tensors)
    return PREAMBLE.pack(MAGIC, version, flags, len(head), zlib.crc32(head), payload_len) + head


def prefix_bound(records: list[TensorRecord], n_chunks: int) -> int:
    """At least the preamble and stored header of any pack of `records` (given without their
    chunks) once they hold `n_chunks` chunks in all: the header's JSON without the chunks,
    plus the longest JSON a chunk reference and a record's chunk list can take."""
    with collections_paused():
        head = _header_json(PackHeader("snapshot", 0, None, 0, records))
    return PREAMBLE.size + len(head) + 512 + 16 * len(records) + 56 * n_chunks


def write_pack(header: PackHeader, chunks: list[bytes]) -> bytes:
    """Serialise a pack. `header.tensors[*].chunks` must already point into `chunks` laid end to end."""
    return join([_prefix(header, sum(memoryview(c).nbytes for c in chunks)), *chunks])


def write_pack_into(header: PackHeader, chunks: list, empty, ready=None) -> np.ndarray:
    """`write_pack`, as a uint8 array of memory from `empty(n)` (n bytes, writable; pinned
    host memory, say). Where `chunks` is one uint8 array that is a view of a larger array
    with room for the preamble and header before it (the CUDA encoder's payload, copied from
    the GPU behind such room), the pack is written around it, and the payload is not copied.
    `ready()`, where given, is called before the chunks' bytes are read or returned (their
    copy into place may still be under way until then): after the header is made."""
    n = sum(memoryview(c).nbytes for c in chunks)
    pre = _prefix(header, n)
    if ready is not None:
        ready()
    if len(chunks) == 1 and isinstance(chunks[0], np.ndarray) and isinstance(chunks[0].base, np.ndarray):
        payload, whole = chunks[0], chunks[0].base
        at = payload.ctypes.data - whole.ctypes.data
        if whole.dtype == np.uint8 and whole.flags.writeable and payload.flags.c_contiguous and at >= len(pre):
            whole[at - len(pre) : at] = np.frombuffer(pre, np.uint8)
            return whole[at - len(pre) : at + n]
    out = empty(len(pre) + n)
    fill(out, [pre, *chunks])
    return out


def read_header(buf: PackBuffer, *, total_length: int | None = None, limits: PackLimits | None = None) -> PackHeader:
    """Parse and check the preamble and header. `buf` needs only the first 24 + H bytes;
    pass `total_length` when `buf` is a prefix, to check the payload length against it.
    `limits`: what the reader accepts beyond the spec's rules (PackLimits' defaults pass any
    pack of a real model). Raises PackFormatError (or a subclass) for anything else."""
    limits = limits or DEFAULT_LIMITS
    mv = memoryview(buf)  # type: ignore[arg-type]  # an ndarray is a buffer; its stubs say so from 3.12 only
    if len(mv) < PREAMBLE.size:
        raise PackFormatError(f"pack truncated: {len(mv)} bytes, the preamble alone is {PREAMBLE.size}")
    magic, version, flags, hlen, hcrc, plen = PREAMBLE.unpack_from(mv, 0)
    if magic != MAGIC:
        raise PackFormatError(f"not a weight-teleport pack (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version not in READ_VERSIONS:
        raise UnsupportedFormatError(
            f"pack format version {version} is not supported by this build (it reads versions "
            f"{', '.join(map(str, READ_VERSIONS))}); upgrade weight-teleport to read it"
        )
    if flags & ~FLAG_HEADER_ZSTD:
        raise UnsupportedFormatError(f"pack flags {flags:#x} are unknown to format version {version}")
    end = PREAMBLE.size + hlen
    if len(mv) < end:
        raise PackFormatError(f"pack truncated inside its header ({len(mv)} of {end} bytes)")
    if hlen > limits.max_header_bytes:
        raise over_limit("header bytes", hlen, limits.max_header_bytes, "max_header_bytes")
    head = bytes(mv[PREAMBLE.size : end])
    if zlib.crc32(head) != hcrc:
        raise PackFormatError("pack header is corrupted (CRC-32 mismatch)")
    total = len(mv) if total_length is None else total_length
    if total != end + plen:
        raise PackFormatError(
            f"pack length {total} does not match its header ({end + plen} bytes): truncated or padded"
        )
    if flags & FLAG_HEADER_ZSTD:
        head = _inflate_header(head, limits)
    try:
        with collections_paused():  # the records' lists are new objects by the thousand
            d = _decode_header(head)
    except msgspec.MsgspecError as e:
        raise PackFormatError(f"pack header is malformed: {e}") from None
    except RecursionError:
        raise PackFormatError("pack header is malformed: its JSON is nested too deeply") from None
    header = PackHeader(
        kind=d.kind,
        version=d.version,
        base_version=d.base_version,
        chunk_elems=d.chunk_elems,
        tensors=d.tensors,
        stream_codecs=d.stream_codecs,
        format_version=version,
        payload_offset=end,
        payload_length=plen,
    )
    check_layout(header, limits)
    return header


def _inflate_header(stored: bytes, limits: PackLimits) -> bytes:
    """The JSON of a compressed header, refused before it is decoded where it would be larger
    than the format allows for its stored bytes or than `limits` allow."""
    allowed = header_bytes_allowed(len(stored))
    size = zstd.declared_size(stored, "compressed pack header")
    if size is not None and size > limits.max_header_bytes and size <= allowed:
        raise over_limit("header bytes", size, limits.max_header_bytes, "max_header_bytes")
    return zstd.inflate(stored, min(allowed, limits.max_header_bytes), "compressed pack header")


def crc32_ranges(data, offsets, lengths, threads: int) -> list[int]:
    """CRC-32 of each byte range of `data`, on `threads` threads that each take a run of
    whole ranges (zlib releases the GIL; one task per range would cost more than the CRCs)."""
    view = memoryview(data)
    spans = list(zip((int(o) for o in offsets), (int(n) for n in lengths)))
    crc = lambda lo, hi: [zlib.crc32(view[o : o + n]) for o, n in spans[lo:hi]]
    return [c for part in in_runs(len(spans), crc, threads) for c in part]


@dataclass
class ChunkSpans:
    """The chunks of some records as arrays, in record order (int64 each)."""

    starts: np.ndarray
    """Byte offsets in the pack (the payload's offset added)."""
    lengths: np.ndarray
    crcs: np.ndarray
    payload_offset: int

    @classmethod
    def of(cls, header: PackHeader, recs: list[TensorRecord]) -> "ChunkSpans":
        """The chunks of `recs`, records of `header` (from read_header, which has their rows)."""
        assert header.chunk_rows is not None and header.chunk_first is not None
        index = {id(t): i for i, t in enumerate(header.tensors)}
        which = np.array([index[id(r)] for r in recs], np.int64)
        first, n = header.chunk_first[which], header.chunk_first[which + 1] - header.chunk_first[which]
        flat = header.chunk_rows[np.repeat(first - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))]
        return cls(flat[:, 0] + header.payload_offset, flat[:, 1], flat[:, 2], header.payload_offset)

    def part(self, lo: int, hi: int) -> "ChunkSpans":
        """Chunks lo..hi-1."""
        return ChunkSpans(self.starts[lo:hi], self.lengths[lo:hi], self.crcs[lo:hi], self.payload_offset)

    def bounds(self) -> tuple[int, int]:
        """[lo, hi): the bytes of the pack the chunks lie in ((0, 0) for none)."""
        if not self.starts.size:
            return 0, 0
        return int(self.starts.min()), int((self.starts + self.lengths).max())

    def compare(self, crcs) -> None:
        """PackFormatError naming the first chunk whose CRC-32 is not `crcs`' one."""
        bad = np.flatnonzero(np.asarray(crcs, np.int64) != self.crcs)
        if bad.size:
            raise _corrupted(int(self.starts[bad[0]]) - self.payload_offset)


def _corrupted(offset: int) -> PackFormatError:
    return PackFormatError(f"pack chunk at payload offset {offset} is corrupted (CRC-32 mismatch)")


def chunk_payload(pack: PackBuffer, header: PackHeader, ref: ChunkRef) -> memoryview:
    """The bytes of one chunk, after checking its CRC-32."""
    start = header.payload_offset + ref.offset
    data = memoryview(pack)[start : start + ref.length]  # type: ignore[arg-type]  # as in read_header
    if len(data) != ref.length or zlib.crc32(data) != ref.crc32:
        raise _corrupted(ref.offset)
    return data
