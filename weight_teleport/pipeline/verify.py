"""Digests of weights in checkpoint layout, to check a target after a patch."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedPatch
from weight_teleport.codec.cpu.chunks import digest_sum
from weight_teleport.codec.digest import finish
from weight_teleport.codec.dtypes import as_uint


def tensor_digest(tensor: torch.Tensor) -> int:
    """The codec's 64-bit digest of a CPU tensor's bytes."""
    u = as_uint(tensor)
    return finish(digest_sum(u, 0), u.nbytes)


def mismatched(state: Mapping[str, torch.Tensor], staged: StagedPatch) -> list[str]:
    """Names of the tensors the patch touched whose bytes in `state` lack its digest."""
    return [t.name for t in staged.tensors
            if t.chunks and tensor_digest(state[t.name]) != t.digest]
