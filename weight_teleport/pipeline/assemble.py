"""Versions made of parts on the receiving side (each part fetched and checked against the
manifest's covers by `fetch.fetch_parts`): every part staged before any is applied (a
version is applied whole or not at all)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

import torch

from weight_teleport.codec import StagedParts, StagedPatch, apply_staged, stage_delta
from weight_teleport.codec import walks as W
from weight_teleport.codec.api import check_allocation, tensor_digests
from weight_teleport.codec.digest import from_hex
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.codec.patch import ChunkPatch, TensorPatch
from weight_teleport.format import PackHeader, TensorRecord
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
            out += [W.flat_chunk(c, sub, order, tuple(state[t.name].shape)) for c in t.chunks]
    names = [n for n in infos if chunks[n]]
    digests = dict(zip(names, tensor_digests([state[n] for n in names])))
    tensors = [
        TensorPatch(n, infos[n].info, tuple(state[n].shape), from_hex(digests[n]) if n in digests else 0, chunks[n])
        for n in infos
    ]
    return FlatParts(
        staged.kind, staged.version, staged.base_version, tensors, staged.base_checked, records=patch_records(staged)
    )


def empty_state(headers: list[PackHeader]) -> dict[str, torch.Tensor]:
    """Uninitialized whole tensors for the records of the packs of `headers` (a snapshot
    made of parts); PackLimitError before anything is allocated where they take more than
    this machine's memory."""
    records: dict[str, TensorRecord] = {}
    for header in headers:
        for r in header.tensors:
            records.setdefault(r.name, r)
    check_allocation(records.values())
    return {r.name: torch.empty(r.shape, dtype=BY_NAME[r.dtype].torch_dtype) for r in records.values()}
