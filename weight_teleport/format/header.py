"""The pack header's records as a program holds them (docs/FORMAT.md, "Header"): what
`container.read_header` decodes and `container.write_pack` writes, and what
`checks.check_layout` checks."""

import itertools
import math
from dataclasses import dataclass, field
from typing import Annotated, NamedTuple

import msgspec
import numpy as np

FORMAT_VERSION = 2
"""The container version the reference writer writes when a record needs it (1 otherwise)."""


class ChunkRef(NamedTuple):
    """Where a chunk lies in the payload (a named tuple: a pack's header holds thousands)."""

    offset: int
    """Byte offset of the chunk from the start of the payload."""
    length: int
    """Byte length of the chunk."""
    crc32: int
    """CRC-32 (zlib) of the chunk bytes."""


Count = Annotated[int, msgspec.Meta(ge=0)]
"""A field that counts something: read from a header, a negative one is malformed (checked
by msgspec as it decodes)."""


class TensorRecord(msgspec.Struct):
    """One tensor of a pack's header. A msgspec Struct: the header's thousands of fields
    decode into it straight from the JSON, typed on the way, with no intermediate dicts (a
    stage reads the header first, before any launch, so its decoding is on the critical
    path)."""

    name: str
    dtype: str
    shape: tuple[Count, ...]
    codec: str
    """A name of format/codecs.py: 'same' (unchanged, no chunks), 'sparse', 'sparse_ac',
    'dense_residual' or 'dense_values'."""
    digest: str
    """Digest of the tensor's full new bytes, 16 hex digits (codec/digest.py)."""
    base_digest: str | None = None
    """Digest of the base tensor's bytes (deltas only)."""
    changed: Count = 0
    """Number of elements whose bit pattern changed (deltas) or all elements (snapshots)."""
    classes: list[tuple[int, int]] = msgspec.field(default_factory=list)
    """Context class map as runs (first key, class): key k maps to the class of the last run
    whose first key is <= k. Sparse codec only."""
    inverted: list[int] = msgspec.field(default_factory=list)
    """Classes whose event stream lists the unchanged elements instead of the changed ones."""
    chunks: list[ChunkRef] = msgspec.field(default_factory=list)
    """Read from a pack: ChunkRefs. A writer may give plain (offset, length, crc32) tuples,
    which are written the same (the CUDA encoder does)."""
    box: list[tuple[Count, Count]] | None = None
    """(Version 2.) (offset, extent) per dimension of `shape`: the part of the checkpoint
    tensor the record covers. None: the whole tensor."""
    order: str | None = None
    """(Version 2.) The walk over the box: 'rows' (None: the default) or 'cols'
    (column-major over the box's 2-D view [e0, e1*e2*...])."""
    cuts: list[int] = msgspec.field(default_factory=list)
    """(Version 2.) Elements of each chunk in walk order; empty: chunks of `chunk_elems`."""
    chunk_digests: list[str] = msgspec.field(default_factory=list)
    """(Version 2.) Per chunk, the digest of its new words numbered by their place in the walk
    (they add up to `digest`)."""
    chunk_base_digests: list[str] = msgspec.field(default_factory=list)
    """(Version 2, deltas.) The same over the base words (they add up to `base_digest`)."""

    @property
    def numel(self) -> int:
        """Elements of the record: of its box, or of the whole tensor."""
        n = 1
        for s in self.shape if self.box is None else (e for _, e in self.box):
            n *= s
        return n

    @property
    def full_numel(self) -> int:
        """Elements of the whole checkpoint tensor."""
        return math.prod(self.shape)

    @property
    def is_v2(self) -> bool:
        """Whether the record uses a field of container version 2."""
        return (
            self.box is not None
            or self.order is not None
            or bool(self.cuts)
            or bool(self.chunk_digests)
            or bool(self.chunk_base_digests)
        )

    def chunk_spans(self, chunk_elems: int) -> list[tuple[int, int]]:
        """[start, stop) walk ranges of the record's chunks (none for a `same` record)."""
        if not self.chunks:
            return []
        if not self.cuts:
            n = self.numel
            return [(s, min(s + chunk_elems, n)) for s in range(0, n, chunk_elems)]
        ends = list(itertools.accumulate(self.cuts))
        return list(zip([0, *ends[:-1]], ends))


@dataclass
class PackHeader:
    kind: str
    version: int
    base_version: int | None
    chunk_elems: int
    tensors: list[TensorRecord]
    stream_codecs: list[str] = field(default_factory=list)
    """Every stream codec the payload uses, so a reader can refuse what it cannot decode upfront."""
    format_version: int = FORMAT_VERSION
    payload_offset: int = 0
    """Where the payload starts in the pack (set by read_header)."""
    payload_length: int = 0
    chunk_rows: np.ndarray | None = field(default=None, repr=False, compare=False)
    """Set by read_header: [chunks, 3] int64 (offset, length, crc32) of every record's chunks,
    records in order, checked (`ChunkSpans.of` takes its rows from here)."""
    chunk_first: np.ndarray | None = field(default=None, repr=False, compare=False)
    """Set by read_header: [records + 1] int64, where each record's chunks start in `chunk_rows`."""
