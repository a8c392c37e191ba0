"""Versions made of parts on the receiving side: fetch every part, check its pack against
the manifest's covers, stage every part before any is applied (a version is applied whole
or not at all)."""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from types import SimpleNamespace

import torch

from weight_teleport.codec import StagedPatch, apply_staged, stage_delta
from weight_teleport.codec.api import _check_allocation as check_allocation
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.format import read_header
from weight_teleport.pipeline.errors import ManifestError, ObjectRejected
from weight_teleport.pipeline.manifest import Entry
from weight_teleport.pipeline.parts import Part, check_whole
from weight_teleport.store import Store


def part_entry(entry: Entry, part: Part) -> Entry:
    """The entry one part's pack is fetched and checked as (the version's kind, version, base)."""
    return Entry(entry.version, entry.kind, entry.base, part.key, part.size, part.sha256, 0, part.piece_bytes)


def fetch_parts(store: Store, entry: Entry, pinned: bool = False) -> list:
    """Every part's pack of `entry`, each checked as `fetch` checks an object and against
    its covers (the names and boxes of its records), and all together covering each of
    their tensors whole: else ObjectRejected."""
    from weight_teleport.pipeline.fetch import fetch

    packs, shapes = [], {}
    for part in entry.parts:
        pack = fetch(store, part_entry(entry, part), pinned)
        header = read_header(pack)
        found = tuple((r.name, tuple(map(tuple, r.box)) if r.box is not None else tuple((0, d) for d in r.shape))
                      for r in header.tensors)
        if found != part.covers:
            raise ObjectRejected(f"{part.key}: its records cover {found[:3]}..., the manifest lists "
                                 f"{part.covers[:3]}... (a pack of another part or writer)")
        for r in header.tensors:
            if shapes.setdefault(r.name, (tuple(r.shape), r.dtype)) != (tuple(r.shape), r.dtype):
                raise ObjectRejected(f"{part.key}: tensor {r.name!r} is {r.shape} {r.dtype} here, "
                                     f"{shapes[r.name]} in another part")
        packs.append(pack)
    try:
        check_whole(entry.parts, {n: s for n, (s, _) in shapes.items()}, f"version {entry.version}")
    except ManifestError as exc:
        raise ObjectRejected(str(exc)) from None
    return packs


def stage_parts(state: Mapping[str, torch.Tensor], packs: list, **options) -> list[StagedPatch]:
    """Each part's pack staged against `state` (whole tensors); nothing written. Parts hold
    disjoint boxes, so each stages against the same weights."""
    return [stage_delta(state, pack, strict=False, **options) for pack in packs]


def apply_parts(state: MutableMapping[str, torch.Tensor], staged: list[StagedPatch], threads: int | None = None):
    for patch in staged:
        apply_staged(state, patch, threads)


def empty_state(packs: list) -> dict[str, torch.Tensor]:
    """Uninitialized whole tensors for the records of `packs` (a snapshot made of parts);
    PackLimitError before anything is allocated where they take more than this machine's
    memory."""
    records = {}
    for pack in packs:
        for r in read_header(pack).tensors:
            records.setdefault(r.name, r)
    whole = [SimpleNamespace(numel=math.prod(r.shape), dtype=r.dtype) for r in records.values()]
    check_allocation(SimpleNamespace(tensors=whole), None)
    return {r.name: torch.empty(r.shape, dtype=BY_NAME[r.dtype].torch_dtype) for r in records.values()}
