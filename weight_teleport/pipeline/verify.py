"""Digests of weights in checkpoint layout, to check a target after a patch.

A record's digest is taken over its walk (docs/FORMAT.md, "Records over boxes"): the box of
the tensor it covers, in its walk order. A tensor published as parts is verified when each
record covering it is: the manifest's covers (checked against the packs) make the boxes
disjoint and cover the tensor whole, so every element is under exactly one digest."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedParts, StagedPatch
from weight_teleport.codec import walks as W
from weight_teleport.codec.api import tensor_digests
from weight_teleport.codec.digest import to_hex

RecordKey = tuple[str, W.Box, str]
"""(tensor name, box in checkpoint coordinates, walk order) of a record."""


def record_key(name: str, shape, box=None, order: str | None = None) -> RecordKey:
    """The key of a record of tensor `name` (whole shape `shape`) over `box` (None: the
    whole tensor) walked in `order` (None: rows)."""
    box = tuple(map(tuple, box)) if box is not None else W.whole(shape)
    return name, box, order if order == "cols" and len(shape) >= 2 else "rows"


def walk_of(state: Mapping[str, torch.Tensor], key: RecordKey) -> torch.Tensor:
    """The elements of record `key` of the whole tensor `state[name]`, in walk order, as
    one contiguous tensor (a copy where the walk is not a contiguous run)."""
    name, box, order = key
    t = state[name]
    if box == W.whole(t.shape) and order == "rows":
        return t
    return W.walk_view(t, W.whole(t.shape), box, order).contiguous()


def patch_records(staged: StagedPatch | StagedParts) -> list[tuple[RecordKey, str, bool]]:
    """(key, promised digest in hex, touched) of every record of a staged version."""
    patches = staged.patches if isinstance(staged, StagedParts) else [staged]
    out = []
    for p in patches:
        for t in p.tensors:
            if t.name in p.walks:
                _, sub, order = p.walks[t.name]
                key = (t.name, tuple(map(tuple, sub)), order if len(sub) >= 2 else "rows")
            else:
                key = record_key(t.name, t.shape)
            out.append((key, to_hex(t.digest), bool(t.chunks)))
    return out


def record_digests(state: Mapping[str, torch.Tensor], keys: list[RecordKey]) -> list[str]:
    """The digest of each record `keys` names, read from whole tensors of `state` (the
    digests of a CUDA state computed in one reduction)."""
    return tensor_digests([walk_of(state, k) for k in keys])


def mismatched(state: Mapping[str, torch.Tensor], staged: StagedPatch | StagedParts) -> list[str]:
    """Names of the tensors the patch touched whose bytes in `state` lack its digests
    (each record over a box checked on its own)."""
    touched = [(k, d) for k, d, hit in patch_records(staged) if hit]
    found = record_digests(state, [k for k, _ in touched])
    return sorted({k[0] for (k, d), f in zip(touched, found) if f != d})
