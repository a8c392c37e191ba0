"""weight-teleport: bit-exact, tiny weight deltas from RL trainers to samplers anywhere."""

from weight_teleport.codec import (
    ApplyReport,
    StagedPatch,
    apply_delta,
    apply_staged,
    decode_snapshot,
    encode_delta,
    encode_snapshot,
    inspect,
    stage_delta,
    tensor_digest,
)

__version__ = "0.1.0"

__all__ = [
    "ApplyReport",
    "StagedPatch",
    "apply_delta",
    "apply_staged",
    "decode_snapshot",
    "encode_delta",
    "encode_snapshot",
    "inspect",
    "stage_delta",
    "tensor_digest",
]
