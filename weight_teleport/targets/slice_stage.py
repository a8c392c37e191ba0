"""One engine worker stages a version on its own, against its own parameters.

The worker reads the pack's header alone (ranged reads), finds per record the chunks inside
its slice (`codec.slices.chunk_window`), fetches only their bytes (adjacent ranges merged
into one read) and decodes them against its own elements, each chunk checked against its
CRC-32 and its chunk digests (format version 2): the proof that the slice's result is the
trainer's, without the rest of the tensor. A version made of parts (a `PublisherGroup`'s
trainer ranks' packs) is read from the parts whose boxes overlap the worker's slices alone.
What comes out is a `Step`: per slice, the walk positions and new bit patterns to write. Nothing touches the parameters until
`apply_steps`, the pause's only work.

Versions staged but not yet applied are `pending`: a delta staged after them is decoded
against the parameters as those versions leave them (the parameters with their writes laid
over a copy of the slice), so a worker can stage a chain of versions ahead of the pause.
Laying a write over the parameters is idempotent, so a commit that applies a pending version
while a later one stages changes nothing in what that one reads.

Layouts come from `targets.vllm_layout.Slice` (fused qkv_proj / gate_up_proj, column-,
row- and vocab-parallel shards); this module knows no engine."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from weight_teleport.codec import walks as W
from weight_teleport.codec.dtypes import BY_NAME, BY_TORCH
from weight_teleport.codec.slices import chunk_byte_range, chunk_positions, chunk_window, record_layout, stage_chunks
from weight_teleport.errors import PackMismatchError
from weight_teleport.format import PackHeader, read_header
from weight_teleport.pipeline.assemble import part_entry
from weight_teleport.pipeline.errors import ManifestError, ObjectRejected
from weight_teleport.pipeline.manifest import Entry
from weight_teleport.pipeline.parts import check_whole
from weight_teleport.targets.slice_view import gather_walk, scatter_walk
from weight_teleport.targets.vllm_layout import Slice

HEADER_PROBE = 16 << 10
"""Bytes read first: the preamble and, for most packs, the whole header (chunks inside
these bytes are not read again)."""
MAX_GAP = 1 << 10
"""Two chunk ranges at most this far apart are fetched in one read: fewer requests for a
few bytes of other ranks' chunks (the small records of replicated tensors lie between)."""


@dataclass(frozen=True)
class SliceWrite:
    """New bit patterns for one slice: at walk positions `positions` of the whole
    tensor (int64), or, where `positions` is None, at the run of positions from `start`."""
    slice: Slice
    positions: torch.Tensor | None
    start: int
    bits: torch.Tensor


@dataclass(frozen=True)
class Step:
    """One version staged on one worker."""
    version: int
    kind: str
    writes: tuple[SliceWrite, ...]
    fetched: int
    """Bytes read from the store for it."""


def read_pack_header(store, entry: Entry) -> tuple[PackHeader, bytes]:
    """The header of `entry`'s pack from its first bytes alone, checked against the entry;
    (header, the first bytes read)."""
    first = store.get_range(entry.key, 0, min(entry.size, HEADER_PROBE))
    if len(first) >= 12:
        need = 24 + int.from_bytes(first[8:12], "little")
        if len(first) < need <= entry.size:
            first += store.get_range(entry.key, len(first), need)
    header = read_header(first, total_length=entry.size)
    if (header.kind, header.version, header.base_version) != (entry.kind, entry.version, entry.base):
        raise ObjectRejected(f"{entry.key}: holds a {header.kind} to version {header.version} from "
                             f"{header.base_version}, the manifest lists a {entry.kind} to {entry.version} "
                             f"from {entry.base}")
    return header, first


def held_box(s: Slice) -> W.Box:
    """The box of the checkpoint tensor that slice `s` holds."""
    rest = tuple((0, d) for d in s.shape[1:])
    if s.order == "rows":
        return ((s.lo, s.hi - s.lo),) + rest
    return ((0, s.shape[0]), (s.lo, s.hi - s.lo)) + rest[1:]


def _in_order(s: Slice, order: str, name: str) -> Slice:
    """`s` walked in the record's `order`: the same slice where the orders agree, or a
    whole unfused tensor (any walk fits it); else the pack was not cut for this layout."""
    if s.order == order:
        return s
    if s.lo == 0 and s.param_shape == s.shape and s.hi == (s.shape[0] if s.order == "rows" else s.shape[1]):
        return Slice(s.name, s.shape, order, 0, s.shape[0] if order == "rows" else s.shape[1], s.param, 0,
                     s.param_shape)
    raise PackMismatchError(f"tensor {name!r}: the pack walks it by {order}, this worker holds {s.order}; "
                            "publish with PublisherConfig.hints = slice_hints(config, tp_sizes)")


def _old_walk(param: torch.Tensor, s: Slice, pending: Sequence[Step]) -> torch.Tensor:
    """The slice's elements in walk order as the pending steps leave them: a view of the
    parameter (rows, nothing pending) or a copy with the pending writes laid over it."""
    mine = [w for step in pending for w in step.writes if w.slice.name == s.name]
    walk = gather_walk(param, s)
    if not mine:
        return walk
    walk = walk.clone()
    ints = walk.view(BY_TORCH[walk.dtype].int_torch)
    for w in mine:
        if w.slice.order != s.order:
            raise PackMismatchError(f"tensor {s.name!r}: versions staged in two walk orders; resync")
        pos = w.positions if w.positions is not None else torch.arange(w.start, w.start + w.bits.numel())
        ints[(pos - s.walk[0]).to(ints.device)] = w.bits.to(ints.device)
    return walk


def _fetch(store, key: str, ranges: list[tuple[int, int]], prefix: bytes) -> tuple[dict, int]:
    """{(start, stop): bytes} of each range: from `prefix` (the pack's first bytes, read
    already) where they lie inside it, else read, adjacent ones together; bytes read."""
    total, n = 0, len(prefix)
    straddle = max((b for a, b in ranges if a < n < b), default=n)
    if straddle > n:  # a chunk begins inside the first bytes: read on from their end
        prefix += store.get_range(key, n, straddle)
        total += straddle - n
    head = memoryview(prefix)
    got = {(a, b): head[a:b] for a, b in ranges if b <= len(head)}
    spans = sorted(set(ranges) - set(got))
    k = 0
    while k < len(spans):
        lo, hi, m = spans[k][0], spans[k][1], k + 1
        while m < len(spans) and spans[m][0] - hi <= MAX_GAP:
            hi, m = max(hi, spans[m][1]), m + 1
        blob = memoryview(store.get_range(key, lo, hi))
        if len(blob) != hi - lo:
            raise ObjectRejected(f"{key}: a ranged read of [{lo}, {hi}) returned {len(blob)} bytes")
        total += hi - lo
        for a, b in spans[k:m]:
            got[(a, b)] = blob[a - lo:b - lo]
        k = m
    return got, total


def stage_entry(store, entry: Entry, params: Mapping[str, torch.Tensor], slices: Mapping[str, Slice],
                pending: Sequence[Step] = ()) -> Step:
    """Stage `entry`'s pack on this worker (parameters `params` by name, its `slices` by
    checkpoint name), after the `pending` steps. Raises a typed error where the pack does
    not fit this worker or a chunk fails its checks; nothing is written. An entry made of
    parts (trainer ranks' packs) is staged from the parts whose boxes overlap this worker's
    slices alone: the others are never read."""
    if entry.parts:
        return _stage_parts(store, entry, params, slices, pending)
    header, prefix = read_pack_header(store, entry)
    writes, read = _stage_pack(store, entry.key, header, prefix, params, slices, pending)
    return Step(entry.version, entry.kind, writes, read)


def _stage_parts(store, entry: Entry, params, slices, pending: Sequence[Step]) -> Step:
    """The parts of `entry` that hold elements of this worker's slices, each header checked
    against its part's covers (the manifest's, checked disjoint and here covering every
    tensor whole), so that every element of a slice lies in exactly one staged record."""
    extra = sorted({name for p in entry.parts for name, _ in p.covers} - set(slices))
    if extra:
        raise PackMismatchError(f"the version holds tensor {extra[0]!r}, which this engine's model lacks")
    try:
        check_whole(entry.parts, {n: s.shape for n, s in slices.items()}, f"version {entry.version}")
    except ManifestError as e:
        raise ObjectRejected(str(e)) from None
    writes, read = [], 0
    for part in entry.parts:
        if not any(W.intersect(box, held_box(slices[name])) for name, box in part.covers):
            continue
        header, prefix = read_pack_header(store, part_entry(entry, part))
        found = tuple((r.name, record_layout(header, r).box) for r in header.tensors)
        if found != part.covers:
            raise ObjectRejected(f"{part.key}: its records cover {found[:3]}..., the manifest lists "
                                 f"{part.covers[:3]}... (a pack of another part or writer)")
        got, n = _stage_pack(store, part.key, header, prefix, params, slices, pending)
        writes += got
        read += n
    return Step(entry.version, entry.kind, tuple(writes), read)


def _stage_pack(store, key: str, header: PackHeader, prefix: bytes, params, slices,
                pending: Sequence[Step]) -> tuple[tuple[SliceWrite, ...], int]:
    """(writes, bytes read) of one pack whose header and first bytes are read already."""
    extra = sorted({r.name for r in header.tensors} - set(slices))
    if extra:
        raise PackMismatchError(f"the pack holds tensor {extra[0]!r}, which this engine's model lacks")
    jobs = []
    for rec in header.tensors:
        layout = record_layout(header, rec)
        s = _in_order(slices[rec.name], layout.order, rec.name)
        param = params[s.param]
        if tuple(rec.shape) != s.shape or BY_NAME[rec.dtype].torch_dtype != param.dtype:
            raise PackMismatchError(f"tensor {rec.name!r} is {rec.shape} {rec.dtype} in the pack, "
                                    f"{s.shape} {param.dtype} in the engine")
        _, i, j = chunk_window(header, rec, held_box(s))
        if i < j:
            jobs.append((rec, layout, s, param, i, j, chunk_byte_range(header, rec, i, j)))
    blobs, read = _fetch(store, key, [job[-1] for job in jobs], prefix)
    writes = [_stage_record(header, job, blobs[job[-1]], pending) for job in jobs]
    return tuple(w for w in writes if w.bits.numel()), len(prefix) + read


def _stage_record(header: PackHeader, job, data, pending: Sequence[Step]) -> SliceWrite:
    rec, layout, s, param, i, j, _ = job
    walk = _old_walk(param, s, pending)
    first, stop = layout.spans[i][0], layout.spans[j - 1][1]
    # A CUDA worker's old elements of the chunks come to the host for decoding (its writes go
    # back in `apply_steps`): the chunk window of one slice at a time, never the model.
    if layout.box == W.whole(layout.shape):
        local = walk[first - s.walk[0]:stop - s.walk[0]].cpu()
        pos, val = stage_chunks(header, rec, (i, j), local, data, walk_start=first)
    else:  # a trainer rank's part: its walk is not a run of this slice's walk
        local = walk[(chunk_positions(header, rec, i, j) - s.walk[0]).to(walk.device)].cpu()
        pos, val = stage_chunks(header, rec, (i, j), local, data)
    bits = val.view(BY_TORCH[val.dtype].int_torch)
    if pos.numel() == stop - first and layout.box == W.whole(layout.shape):
        return SliceWrite(s, None, first, bits)  # every element: a run, no positions kept
    return SliceWrite(s, pos, 0, bits)


def apply_steps(params: Mapping[str, torch.Tensor], steps: Sequence[Step]) -> None:
    """Write the steps into the parameters in place, in order (later writes win)."""
    for step in steps:
        for w in step.writes:
            param = params[w.slice.param]
            if w.positions is None and w.slice.order == "rows":
                at = w.slice.local_index(w.start)
                param.view(-1).view(w.bits.dtype)[at:at + w.bits.numel()] = w.bits.to(param.device)
            else:
                pos = w.positions if w.positions is not None else torch.arange(w.start, w.start + w.bits.numel())
                scatter_walk(param, w.slice, pos, w.bits)
