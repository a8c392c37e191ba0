"""Byte-stream codecs: how each stream of a chunk is stored.

Ids are part of the format (docs/FORMAT.md). The CPU reads and writes `raw` and `zstd`;
the others are written by the CUDA backend and name what a reader needs."""

import threading

import numpy as np
import zstandard

from weight_teleport.errors import PackFormatError
from weight_teleport.format import zstd
from weight_teleport.format.limits import ZSTD_MAX_EXPANSION

RAW, ZSTD, LZ4, NVCOMP_ANS = 0, 1, 2, 3
NAMES = {RAW: "raw", ZSTD: "zstd", LZ4: "lz4", NVCOMP_ANS: "nvcomp-ans"}
CPU_READABLE = {RAW, ZSTD}

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "zstd", None)
    if cache is None:
        cache = _local.zstd = {}
    if level not in cache:
        # Streams are symbol streams with little repetition: long minimum matches keep
        # zstd from trading cheap Huffman-coded literals for costly short matches.
        params = zstandard.ZstdCompressionParameters(
            compression_level=level,
            min_match=7,
            strategy=zstandard.STRATEGY_FAST,
            write_checksum=0,
            write_content_size=0,
            write_dict_id=0,
        )
        cache[level] = zstandard.ZstdCompressor(compression_params=params)
    return cache[level]


def encode_stream(data: np.ndarray | bytes, level: int) -> tuple[int, bytes]:
    """Store a stream with zstd at `level`, or raw where zstd does not make it smaller."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if len(raw) < 16:
        return RAW, raw
    packed = _compressor(level).compress(raw)
    return (ZSTD, packed) if len(packed) < len(raw) else (RAW, raw)


def decode_stream(codec: int, data: bytes | memoryview, raw_len: int) -> np.ndarray:
    """The raw bytes of a stream as a uint8 array of exactly `raw_len` bytes."""
    if codec == RAW:
        if len(data) != raw_len:
            raise PackFormatError(f"raw stream holds {len(data)} bytes, the table says {raw_len}")
        return np.frombuffer(data, np.uint8)
    if codec == ZSTD:
        if raw_len == 0:
            raise PackFormatError("empty zstd stream")
        if raw_len > ZSTD_MAX_EXPANSION * len(data):
            raise PackFormatError(
                f"zstd stream is corrupted: its {len(data)} stored bytes cannot hold the "
                f"{raw_len} raw bytes its table says"
            )
        out = zstd.inflate(data, raw_len, "zstd stream")
        if len(out) != raw_len:
            raise PackFormatError(f"zstd stream decodes to {len(out)} bytes, the table says {raw_len}")
        return np.frombuffer(out, np.uint8)
    # Packs that use other codecs are refused from their header (stream_codecs) before any
    # chunk is read, so a chunk naming one disagrees with its own header.
    name = NAMES.get(codec, f"unknown codec id {codec}")
    raise PackFormatError(
        f"a chunk uses stream codec {name!r}, which its pack header does not list: the chunk is corrupt"
    )


def check_sparse_lengths(events: np.ndarray, raw: np.ndarray, elems: np.ndarray, width: int) -> None:
    """PackFormatError unless the streams of sparse chunks have lengths the format allows:
    `events` [chunks, classes] are the groups' counts, `raw` [chunks, classes, 4] their
    streams' raw lengths (zeros for a group without streams), `elems` [chunks] the chunks'
    elements, `width` the bytes of an element. Checked before any stream is decoded, these
    bound what decoding allocates by the chunks' elements, whatever the table declares."""
    bits_cap = 3 * events  # an event has at most 21 extra bits (bucket 44)
    bad = (
        (raw[..., 0] != events).any(1)  # a symbol an event; no streams, no events
        | (events.sum(1) > elems)
        | (raw[..., 2].sum(1) > elems)  # a class's events and changes are its elements
        | (raw[..., 1] > bits_cap).any(1)
        | (raw[..., 3] > width * raw[..., 2]).any(1)
        | (raw[..., 3] % width != 0).any(1)
    )
    if bad.any():
        raise PackFormatError("sparse chunk's streams have lengths its elements cannot need (a corrupt stream table)")
