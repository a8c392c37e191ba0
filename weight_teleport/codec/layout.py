"""Where the reference writer puts a delta's chunks in its payload (docs/FORMAT.md, "Payload
layout"). A reader finds every chunk by its offset, so any order is a valid pack; this one
lets a receiver holding a slice of the model fetch its bytes in few ranged reads. By default
a payload holds each record's chunks in record order, so a tensor-parallel rank's chunks are
scattered over every record; where the publisher cut records at receivers' slice bounds
(hints), the chunks of records every rank reads whole come first, then those of each slice
of the whole tensors (slice 0 of every record, then slice 1, ...). A TP rank then reads two
runs of bytes, whatever the number of tensors: the shared records and its slices."""

import bisect
from collections.abc import Sequence

from weight_teleport.format import ChunkRef, TensorRecord


def slice_major(records: Sequence[TensorRecord], parts: list, slices: Sequence[Sequence[int] | None]) -> list:
    """The payload `parts` (bytes-like, laid end to end; the records' chunk offsets point
    into their concatenation, no chunk across two parts) laid out again: the chunks of the
    records whose `slices` are None (read whole by every receiver) in record order, then
    for each slice index in increasing order the chunks of that slice (`slices[i][k]`: the
    slice of record i's chunk k) in record order. The records' chunk offsets are rewritten;
    returns the new parts (views of the old ones: nothing is copied)."""
    order = [
        (-1, i, k) for i, (rec, sl) in enumerate(zip(records, slices)) if sl is None for k in range(len(rec.chunks))
    ]
    order += sorted((s, i, k) for i, sl in enumerate(slices) if sl is not None for k, s in enumerate(sl))
    views = [memoryview(p).cast("B") for p in parts]
    starts, at = [], 0
    for v in views:
        starts.append(at)
        at += len(v)
    out, offsets, at = [], [dict[int, int]() for _ in records], 0
    for _, i, k in order:
        offset, length, _ = records[i].chunks[k]
        p = bisect.bisect_right(starts, offset) - 1
        lo = offset - starts[p]
        assert lo + length <= len(views[p]), "a chunk lies across two parts"
        out.append(views[p][lo : lo + length])
        offsets[i][k] = at
        at += length
    for rec, new in zip(records, offsets):
        rec.chunks = [_ref(c, new[k]) for k, c in enumerate(rec.chunks)]
    return out


def _ref(chunk, offset: int):
    """`chunk` (a ChunkRef or a plain (offset, length, crc) tuple: the header writes both
    the same) at `offset`."""
    return ChunkRef(offset, chunk[1], chunk[2]) if isinstance(chunk, ChunkRef) else (offset, chunk[1], chunk[2])
