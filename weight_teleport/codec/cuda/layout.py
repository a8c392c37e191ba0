"""Layout checks every kernel wrapper runs before a launch."""

import torch


def on_device(tensor: torch.Tensor) -> bool:
    """Whether the kernels can read `tensor` where it is."""
    return tensor.is_cuda


def require(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`tensor` itself, after asserting it is a flat contiguous device array of `dtype`."""
    assert on_device(tensor), f"kernel input on {tensor.device}, expected a CUDA device"
    assert tensor.dim() == 1 and tensor.is_contiguous(), "kernel input must be flat and contiguous"
    assert dtype is None or tensor.dtype == dtype, f"kernel input is {tensor.dtype}, expected {dtype}"
    return tensor
