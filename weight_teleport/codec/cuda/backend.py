"""The CUDA backend's interface, the same few functions as the CPU backend's."""

from weight_teleport.codec.cuda.apply import apply
from weight_teleport.codec.cuda.encode import encode
from weight_teleport.codec.cuda.live import EncodeItem, Live
from weight_teleport.codec.cuda.stage import stage

item = EncodeItem.of

__all__ = ["EncodeItem", "Live", "apply", "encode", "item", "stage"]
