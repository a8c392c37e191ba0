"""Bit-exact delta codec: encode the change between two states, stage it, apply it."""

from weight_teleport.codec.api import (
    apply_delta,
    apply_staged,
    bind_staged,
    check_allocation,
    decode_snapshot,
    encode_delta,
    encode_snapshot,
    inspect,
    pinned_pack,
    stage_delta,
    tensor_digest,
)
from weight_teleport.codec.patch import ApplyReport, StagedParts, StagedPatch
from weight_teleport.codec.walks import Hint, TensorSlice
from weight_teleport.format.limits import PackLimits

__all__ = [
    "ApplyReport",
    "Hint",
    "PackLimits",
    "StagedParts",
    "StagedPatch",
    "TensorSlice",
    "apply_delta",
    "apply_staged",
    "bind_staged",
    "check_allocation",
    "decode_snapshot",
    "encode_delta",
    "encode_snapshot",
    "inspect",
    "pinned_pack",
    "stage_delta",
    "tensor_digest",
]
