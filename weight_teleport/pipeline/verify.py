"""Digests of weights in checkpoint layout, to check a target after a patch."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedPatch
from weight_teleport.codec.api import tensor_digests
from weight_teleport.codec.digest import to_hex


def mismatched(state: Mapping[str, torch.Tensor], staged: StagedPatch) -> list[str]:
    """Names of the tensors the patch touched whose bytes in `state` lack its digest (the
    digests of a CUDA state computed in one reduction)."""
    touched = [t for t in staged.tensors if t.chunks]
    found = tensor_digests([state[t.name] for t in touched])
    return [t.name for t, d in zip(touched, found) if d != to_hex(t.digest)]
