"""Sampler formats: the checkpoint a quantized sampler loads, made from the trainer's
weights on the trainer's device (`PublisherConfig.sampler_format`). docs/FORMAT.md defines
each bit of it."""

from weight_teleport.quantize.formats import FORMATS, FormatName, SamplerFormat, sampler_format

__all__ = ["FORMATS", "FormatName", "SamplerFormat", "sampler_format"]
