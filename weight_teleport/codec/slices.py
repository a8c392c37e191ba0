"""Slices of records: what a receiver holding part of a tensor reads, fetches and stages
(docs/FORMAT.md, "Records over boxes").

A sampler rank reads a pack's header alone (`format.read_header` on its first bytes), finds
per record the chunks inside its slice (`chunk_window`), fetches their bytes alone
(`chunk_byte_range`, one ranged read), and decodes them against its own old elements
(`stage_chunks`), each chunk checked against its CRC and its own digests."""

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from weight_teleport.codec import walks as W
from weight_teleport.codec.cpu import backend as cpu
from weight_teleport.codec.dtypes import BY_NAME
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


def chunk_positions(header: PackHeader, rec: TensorRecord, i: int, j: int) -> torch.Tensor:
    """Positions (int64) in the walk of the WHOLE tensor (in the record's order) of every
    element of chunks [i, j), in walk order: gather `local_walk` for `stage_chunks` with
    them where the record's walk is not a contiguous range of yours."""
    _check_range(rec, i, j)
    shape, box, order, spans = record_layout(header, rec)
    if i == j:
        return torch.zeros(0, dtype=torch.int64)
    walk = torch.arange(spans[i][0], spans[j - 1][1], dtype=torch.int64)
    return W.tensor_positions(box, order, shape, walk)


def stage_chunks(header: PackHeader, rec: TensorRecord, chunk_range: tuple[int, int],
                 local_walk: torch.Tensor, chunk_bytes, *, walk_start: int | None = None,
                 check_base: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode chunks [i, j) of record `rec` (of `header`, from `read_header`) against a
    receiver's old elements; nothing is written.

    `local_walk` (1-D, on the CPU, the record's dtype) holds the record's walk elements from
    `walk_start` on (default: the first element of chunk i), every element of those chunks.
    `chunk_bytes`: the pack's bytes `chunk_byte_range(header, rec, i, j)`. Each chunk is
    checked against its CRC-32 and its chunk digests: with `check_base`, that `local_walk`
    holds the base weights (PackMismatchError), and that the patched chunk has the promised
    digest (DigestMismatchError). Corrupt bytes raise PackFormatError.

    Returns (positions, values): int64 positions in the walk of the WHOLE tensor (in the
    record's order) and their new bit patterns (`local_walk`'s dtype): of the changed
    elements of sparse chunks, of every element of dense ones."""
    i, j = chunk_range
    _check_range(rec, i, j)
    info = BY_NAME[rec.dtype]
    if local_walk.dtype != info.torch_dtype or local_walk.dim() != 1 or not local_walk.is_cpu:
        raise PackMismatchError(f"tensor {rec.name!r}: local_walk is {tuple(local_walk.shape)} {local_walk.dtype} "
                                f"on {local_walk.device}; the record needs a 1-D CPU tensor of {rec.dtype}")
    if i == j:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=local_walk.dtype)
    layout = record_layout(header, rec)
    first, stop = layout.spans[i][0], layout.spans[j - 1][1]
    walk_start = first if walk_start is None else int(walk_start)
    if not walk_start <= first or stop - walk_start > local_walk.numel():
        raise PackMismatchError(f"tensor {rec.name!r}: local_walk holds walk elements {walk_start}.."
                                f"{walk_start + local_walk.numel()}; chunks {i}..{j} need {first}..{stop}")
    shifted = dataclasses.replace(header, tensors=[rec], payload_offset=-rec.chunks[i].offset)
    live = cpu.Live(local_walk.contiguous(), info)
    staged = cpu.stage({rec.name: live}, shifted, chunk_bytes, check_base and header.kind == "delta", 1,
                       windows={rec.name: (walk_start, i, j)})
    pos, val = [], []
    for c in staged.tensors[0].chunks:
        p = np.arange(c.values.size, dtype=np.int64) if c.positions is None else c.positions.astype(np.int64)
        pos.append(p + c.start + walk_start)
        val.append(c.values)
    positions = W.tensor_positions(layout.box, layout.order, layout.shape, torch.from_numpy(np.concatenate(pos)))
    values = torch.from_numpy(np.concatenate(val).view(f"<i{info.nbytes}")).view(local_walk.dtype)
    return positions, values


def _check_range(rec: TensorRecord, i: int, j: int) -> None:
    if not 0 <= i <= j <= len(rec.chunks):
        raise ValueError(f"tensor {rec.name!r}: chunks [{i}, {j}) of a record of {len(rec.chunks)}")
