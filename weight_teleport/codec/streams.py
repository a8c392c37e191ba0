"""Byte-stream codecs: how each stream of a chunk is stored.

Ids are part of the format (docs/FORMAT.md). The CPU reads and writes `raw` and `zstd`;
the others are written by the CUDA backend and name what a reader needs."""

import threading

import numpy as np
import zstandard

from weight_teleport.errors import PackFormatError

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
            compression_level=level, min_match=7, strategy=zstandard.STRATEGY_FAST,
            write_checksum=0, write_content_size=0, write_dict_id=0)
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
        try:
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_len)
        except zstandard.ZstdError as e:
            raise PackFormatError(f"zstd stream is corrupted: {e}") from None
        if len(out) != raw_len:
            raise PackFormatError(f"zstd stream decodes to {len(out)} bytes, the table says {raw_len}")
        return np.frombuffer(out, np.uint8)
    # Packs that use other codecs are refused from their header (stream_codecs) before any
    # chunk is read, so a chunk naming one disagrees with its own header.
    name = NAMES.get(codec, f"unknown codec id {codec}")
    raise PackFormatError(f"a chunk uses stream codec {name!r}, which its pack header does not "
                          "list: the chunk is corrupt")
