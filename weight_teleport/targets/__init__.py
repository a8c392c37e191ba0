"""Where weights live on the sampler. A target applies staged patches to its live weights."""

from weight_teleport.subscribe.target import Target

__all__ = ["Target"]
