"""weight-teleport: bit-exact, tiny weight deltas from RL trainers to samplers anywhere.

The public names are imported on first use, so that `import weight_teleport.<module>` stays
light (it does not load the codec's compiled kernels)."""

import importlib

__version__ = "0.1.0"

_CODEC = ["ApplyReport", "Hint", "PackLimits", "StagedPatch", "TensorSlice", "apply_delta", "apply_staged", "decode_snapshot",
          "encode_delta", "encode_snapshot", "inspect", "pinned_pack", "stage_delta", "tensor_digest"]
_PIPELINE = ["Publisher", "PublisherConfig", "Subscriber", "SubscriberConfig"]

__all__ = _CODEC + _PIPELINE


def __getattr__(name: str):
    if name in _CODEC:
        return getattr(importlib.import_module("weight_teleport.codec"), name)
    if name in _PIPELINE:
        return getattr(importlib.import_module("weight_teleport.pipeline"), name)
    raise AttributeError(f"module 'weight_teleport' has no attribute {name!r}")
