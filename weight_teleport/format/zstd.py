"""Bounded decoding of one zstd frame: never more output than the caller allows.

zstandard's one-shot `decompress` sizes its output by the content size a frame declares,
whatever `max_output_size` says, so a frame of a few kilobytes declaring a gigabyte gets a
gigabyte. The declared size is read and checked first; a frame that declares none is
decoded into `max_output_size` bytes at most."""

import zstandard

from weight_teleport.errors import PackFormatError


def declared_size(frame: bytes | memoryview, what: str) -> int | None:
    """The content size the zstd frame's header declares, or None where it declares none."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError:
        raise PackFormatError(f"{what} is not a zstd frame (its frame header is malformed)") from None
    return None if size < 0 else size


def inflate(frame: bytes | memoryview, limit: int, what: str) -> bytes:
    """The content of the zstd frame `frame`, at most `limit` bytes; PackFormatError where it
    declares more, holds more, or is corrupt. The caller checks the length it expects."""
    assert limit > 0, "zstandard reads a max_output_size of 0 as no limit"
    size = declared_size(frame, what)
    if size is not None and size > limit:
        raise PackFormatError(f"{what} declares {size} bytes, at most {limit} are allowed")
    try:
        return zstandard.ZstdDecompressor().decompress(frame, max_output_size=limit)
    except zstandard.ZstdError as e:
        raise PackFormatError(f"{what} is corrupted or holds more than {limit} bytes: {e}") from None
