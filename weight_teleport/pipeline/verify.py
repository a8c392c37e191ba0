"""Digests of weights in checkpoint layout, to check a target after a patch."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedPatch, tensor_digest
from weight_teleport.codec.digest import to_hex


def mismatched(state: Mapping[str, torch.Tensor], staged: StagedPatch) -> list[str]:
    """Names of the tensors the patch touched whose bytes in `state` lack its digest."""
    return [t.name for t in staged.tensors
            if t.chunks and tensor_digest(state[t.name]) != to_hex(t.digest)]
