"""Slices of records: what a receiver holding part of a tensor reads, fetches and stages
(docs/FORMAT.md, "Records over boxes").

A sampler rank reads a pack's header alone (`format.read_header` on its first bytes), finds
per record the chunks inside its slice (`chunk_window`), fetches their bytes alone
(`chunk_byte_ranges`, a ranged read per run), and stages them against its own old elements
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
        raise PackMismatchError(
            f"tensor {rec.name!r}: the pack's chunks are not cut at the bounds of this "
            f"slice (walk elements {a}..{b}); publish with a hint giving its bounds"
        )
    return (a, inside[0], inside[-1] + 1) if inside else (a, 0, 0)


def chunk_byte_ranges(header: PackHeader, rec: TensorRecord, i: int, j: int) -> list[tuple[int, int]]:
    """[start, stop) of each run of the pack's bytes holding chunks [i, j) of `rec`, one run
    per stretch of them laid back to back (a ranged read each): one run where a slice lies
    within one slice of the writer's layout (codec/layout.py), more where it spans several
    or the chunks lie elsewhere."""
    _check_range(rec, i, j)
    out: list[list[int]] = []
    for offset, length, _ in rec.chunks[i:j]:
        start = header.payload_offset + offset
        if out and out[-1][1] == start:
            out[-1][1] = start + length
        else:
            out.append([start, start + length])
    return [(a, b) for a, b in out]


def _check_range(rec: TensorRecord, i: int, j: int) -> None:
    if not 0 <= i <= j <= len(rec.chunks):
        raise ValueError(f"tensor {rec.name!r}: chunks [{i}, {j}) of a record of {len(rec.chunks)}")
