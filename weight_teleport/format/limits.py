"""What a reader accepts of a pack it did not write: the spec's limits, and the ones a caller sets.

A pack comes from a store, and everything read from a store is untrusted: every size a
header or chunk table declares is checked against these limits, and against the bytes the
pack really holds, before anything is allocated from it (docs/FORMAT.md, "Limits")."""

from dataclasses import dataclass

from weight_teleport.errors import PackLimitError

MAX_CHUNK_ELEMS = 1 << 22
"""Elements of a chunk at most: a gap inside a chunk must fit the event symbol's 45 buckets."""
ZSTD_MAX_EXPANSION = 1 << 15
"""Raw bytes a zstd frame can hold per stored byte, at most: a block decodes to 128 KiB at
most and takes at least 4 bytes (an RLE block: a 3-byte block header and the byte)."""
HEADER_MAX_EXPANSION = 32
"""A compressed header decodes to at most this many times its stored bytes, or to
HEADER_FREE_BYTES, whichever is larger (a writer stores a header that compresses better
uncompressed). The decoded JSON's records and chunk lists take about 10 times its bytes in
memory: this keeps a small pack from declaring millions of them."""
HEADER_FREE_BYTES = 4 << 20
"""Decoded header bytes a compressed header may always have, whatever its ratio."""


@dataclass(frozen=True)
class PackLimits:
    """Limits a reader sets on the packs it accepts, on top of the spec's own. The defaults
    pass any pack of any real model; lower them where a process must stay within a budget.
    A pack past a limit raises PackLimitError (a PackFormatError) before anything is
    allocated from it."""

    max_header_bytes: int = 1 << 28
    """Bytes of the header's JSON (decompressed) at most."""
    max_numel: int = 1 << 40
    """Elements of one tensor at most (and of any one dimension)."""
    max_bytes: int | None = None
    """Bytes of new tensors a call may allocate from a pack's header (`decode_snapshot`) at
    most. None: this machine's physical memory, where it can be read."""

    def __post_init__(self):
        for name in ("max_header_bytes", "max_numel", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"PackLimits.{name} must be a non-negative integer, got {value!r}")
        if self.max_numel >= 1 << 56:
            raise ValueError(f"PackLimits.max_numel must be below 2^56, got {self.max_numel}")


DEFAULT_LIMITS = PackLimits()


def header_bytes_allowed(stored: int) -> int:
    """Decoded bytes the format allows a compressed header of `stored` bytes."""
    return max(HEADER_FREE_BYTES, HEADER_MAX_EXPANSION * stored)


def over_limit(what: str, amount: int, limit: int, setting: str) -> PackLimitError:
    """The error for a pack that needs `amount` of something a limit allows `limit` of."""
    return PackLimitError(
        f"pack {what} ({amount}) exceeds the limit of {limit}; if the pack is trusted, "
        f"raise PackLimits.{setting} (pass limits=PackLimits(...))"
    )
