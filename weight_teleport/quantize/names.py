"""The sampler formats' names, which checkpoint tensors block-FP8 quantizes and what it
names their scales (plain Python: configs, the CLI and the layout modules read it without
torch)."""

from typing import Literal, get_args

FormatName = Literal["fp8-block"]
FORMATS: tuple[str, ...] = get_args(FormatName)
"""The sampler formats a publisher can make (`PublisherConfig.sampler_format`)."""

BLOCK = 128
"""Rows and columns of a scale block."""


def quantized_name(name: str) -> bool:
    """Whether block-FP8 quantizes a 2-D floating tensor named `name`: the weights of linear
    projections (attention, MLP and expert `*_proj.weight`)."""
    return name.endswith("_proj.weight")


def scale_name(name: str) -> str:
    """The name of a quantized weight's scales (`X_proj.weight_scale_inv`)."""
    return name + "_scale_inv"
