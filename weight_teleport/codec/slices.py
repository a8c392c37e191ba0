"""Slices of records: what a receiver holding part of a tensor reads, fetches and stages
(docs/FORMAT.md, "Records over boxes").

A sampler rank reads a pack's header alone (`format.read_header` on its first bytes), finds
per record the chunks inside its slice (`chunk_window`), fetches their bytes alone
(`chunk_byte_range`, one ranged read), and stages them against its own old elements
(`codec.api.stage_delta` with `held`), each run of chunks checked against its CRC-32s and
its chunk digests."""

from typing import NamedTuple

from weight_teleport.codec import walks as W
from weight_teleport.errors import PackMismatchError
from weight_teleport.format import PackHeader, TensorRecord


class RecordLayout(NamedTuple):
    """Where a record's elements lie, from its header alone."""
    shape: tuple[int, ...]
    """Shape of the whole checkpoint tensor."""
    box: W.Box
    """The box the record covers ((offset, extent) per dim; the whole tensor when absent)."""
    order: str
    """The walk over the box: 'rows' or 'cols'."""
    spans: list[tuple[int, int]]
    """[start, stop) of each chunk in the record's walk (its cuts, or regular chunks)."""


def record_layout(header: PackHeader, rec: TensorRecord) -> RecordLayout:
    """The (shape, box, order, chunk spans) of `rec`, a record of `header`."""
    box = tuple(map(tuple, rec.box)) if rec.box is not None else W.whole(rec.shape)
    return RecordLayout(tuple(rec.shape), box, rec.order or "rows", rec.chunk_spans(header.chunk_elems))


def chunk_window(header: PackHeader, rec: TensorRecord, held: W.Box) -> tuple[int, int, int]:
    """(walk start, first chunk, stop chunk): the chunks of `rec` whose elements lie in box
    `held` of the tensor, and where the held elements begin in the record's walk. (a, 0, 0)
    where none do. PackMismatchError where the held elements are not one contiguous run of
    the record's walk, or where a chunk lies partly inside them (the pack was not cut for
    this slice: publish with a hint giving its bounds)."""
    shape, box, order, spans = record_layout(header, rec)
    sub = W.intersect(box, held) if W.numel(box) else box
    if sub is None:
        return 0, 0, 0
    try:
        a, b = W.walk_range(box, order, sub)
    except ValueError as e:
        raise PackMismatchError(f"tensor {rec.name!r}: {e}; publish with a hint of that order") from None
    inside = [k for k, (s, e) in enumerate(spans) if s < b and e > a]
    if any(spans[k][0] < a or spans[k][1] > b for k in inside):
        raise PackMismatchError(f"tensor {rec.name!r}: the pack's chunks are not cut at the bounds of this "
                                f"slice (walk elements {a}..{b}); publish with a hint giving its bounds")
    return (a, inside[0], inside[-1] + 1) if inside else (a, 0, 0)


def chunk_byte_range(header: PackHeader, rec: TensorRecord, i: int, j: int) -> tuple[int, int]:
    """[start, stop) of the pack's bytes holding chunks [i, j) of `rec` (one ranged read).
    The reference writer lays a record's chunks back to back; PackMismatchError where this
    pack's are not (fetch them one by one: `rec.chunks[k]` has offset and length)."""
    _check_range(rec, i, j)
    refs = rec.chunks[i:j]
    if not refs:
        return header.payload_offset, header.payload_offset
    if any(b.offset != a.offset + a.length for a, b in zip(refs, refs[1:])):
        raise PackMismatchError(f"tensor {rec.name!r}: chunks {i}..{j} are not back to back in the pack")
    return header.payload_offset + refs[0].offset, header.payload_offset + refs[-1].offset + refs[-1].length


def _check_range(rec: TensorRecord, i: int, j: int) -> None:
    if not 0 <= i <= j <= len(rec.chunks):
        raise ValueError(f"tensor {rec.name!r}: chunks [{i}, {j}) of a record of {len(rec.chunks)}")
