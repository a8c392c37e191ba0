"""Sampler formats: the checkpoint a quantized sampler loads, made from the trainer's
weights on the trainer's device (`PublisherConfig.sampler_format`). docs/FORMAT.md defines
each bit of it. Names load on first use: the format names (`names`) need no torch."""

from weight_teleport.lazy import lazy_exports

_HOMES = {
    "FORMATS": ".names",
    "FormatName": ".names",
    "SamplerFormat": ".formats",
    "sampler_format": ".formats",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
