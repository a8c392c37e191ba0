"""Versions made of parts on the receiving side (each part fetched and checked against the
manifest's covers by `fetch.fetch_parts`): every part staged before any is applied (a
version is applied whole or not at all)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from weight_teleport.codec import StagedParts, StagedPatch, apply_staged, stage_delta
from weight_teleport.codec import walks as W
from weight_teleport.codec.api import _check_allocation as check_allocation
from weight_teleport.codec.api import tensor_digests
from weight_teleport.codec.digest import from_hex
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.codec.patch import ChunkPatch, TensorPatch
from weight_teleport.format import PackHeader
from weight_teleport.pipeline.verify import patch_records


def stage_parts(state: Mapping[str, torch.Tensor], packs: list, **options) -> StagedParts:
    """Each part's pack (`fetch.Fetched`, as `fetch_parts` returns them) staged against
    `state` (whole tensors); nothing written. Parts hold disjoint boxes, so each stages
    against the same weights, and each record is checked against its own digests before
    anything is written."""
    options = {"strict": False, **options}
    return StagedParts([stage_delta(state, p.data, header=p.header, **options) for p in packs])


def apply_parts(state: MutableMapping[str, torch.Tensor], staged: StagedParts, threads: int | None = None):
    apply_staged(state, staged, threads)


@dataclass
class FlatParts(StagedPatch):
    """A version made of parts as one patch in flat row-major positions of whole tensors
    (what targets without a checkpoint view write), with the records it was staged from."""

    records: list = field(default_factory=list)
    """(record key, digest, touched) of every record of the parts (`verify.patch_records`)."""


def flat_patch(staged: StagedParts, state: Mapping[str, torch.Tensor]) -> FlatParts:
    """`staged` (already applied to `state`, whole tensors) as one patch of flat row-major
    chunks per tensor; each tensor's digest is read from `state`."""
    chunks: dict[str, list[ChunkPatch]] = {}
    infos = {}
    for p in staged.patches:
        for t in p.tensors:
            infos[t.name] = t
            out = chunks.setdefault(t.name, [])
            sub, order = (p.walks[t.name][1], p.walks[t.name][2]) if t.name in p.walks else (None, "rows")
            out += [_flat_chunk(c, sub, order, tuple(state[t.name].shape)) for c in t.chunks]
    names = [n for n in infos if chunks[n]]
    digests = dict(zip(names, tensor_digests([state[n] for n in names])))
    tensors = [TensorPatch(n, infos[n].info, tuple(state[n].shape), from_hex(digests[n]) if n in digests else 0,
                           chunks[n]) for n in infos]
    return FlatParts(staged.kind, staged.version, staged.base_version, tensors, staged.base_checked,
                     records=patch_records(staged))


def flat_walks(staged: StagedPatch) -> StagedPatch:
    """`staged` (one pack) with its records walked by columns or over a box rewritten as
    flat row-major chunks of whole tensors: the contract of targets without a view
    (pipeline/target.py), which know nothing of walks. Packs cut for sliced receivers
    (`PublisherConfig.hints`) walk row-parallel tensors by columns."""
    if not staged.walks:
        return staged
    tensors = [t if t.name not in staged.walks else
               dataclasses.replace(t, chunks=[_flat_chunk(c, staged.walks[t.name][1], staged.walks[t.name][2],
                                                          tuple(t.shape)) for c in t.chunks])
               for t in staged.tensors]
    return dataclasses.replace(staged, tensors=tensors, walks={})


def _flat_chunk(c: ChunkPatch, box, order: str, shape: tuple[int, ...]) -> ChunkPatch:
    """A chunk of a record over `box` (None: the whole tensor, rows) in the record's walk,
    as positions in the whole tensor's row-major order (ascending)."""
    if box is None or (order == "rows" and tuple(map(tuple, box)) == W.whole(shape)):
        return c
    walk = torch.arange(c.values.size, dtype=torch.int64) if c.positions is None \
        else torch.from_numpy(c.positions.astype(np.int64))
    pos = W.tensor_positions(tuple(map(tuple, box)), order, shape, walk + c.start)
    if order == "cols" and len(shape) >= 2:
        rows = shape[0]
        pos = (pos % rows) * (math.prod(shape) // max(rows, 1)) + pos // rows
    pos, perm = torch.sort(pos)
    return ChunkPatch(0, pos.numpy(), c.values[perm.numpy()])


def empty_state(headers: list[PackHeader]) -> dict[str, torch.Tensor]:
    """Uninitialized whole tensors for the records of the packs of `headers` (a snapshot
    made of parts); PackLimitError before anything is allocated where they take more than
    this machine's memory."""
    records = {}
    for header in headers:
        for r in header.tensors:
            records.setdefault(r.name, r)
    whole = [SimpleNamespace(numel=math.prod(r.shape), dtype=r.dtype) for r in records.values()]
    check_allocation(SimpleNamespace(tensors=whole), None)
    return {r.name: torch.empty(r.shape, dtype=BY_NAME[r.dtype].torch_dtype) for r in records.values()}
