"""Layout checks every kernel wrapper runs before a launch, where runs of items start, and
the upload of host tables."""

import numpy as np
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


def starts(counts, axis: int = 0):
    """Where each of consecutive runs of `counts` items starts: the exclusive prefix sum
    along `axis` (a numpy array or a torch tensor, as given)."""
    return counts.cumsum(axis) - counts


def items(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(run, index within its run) of every item of consecutive runs of `counts` items."""
    run = np.repeat(np.arange(counts.size), counts)
    return run, np.arange(run.size) - starts(counts)[run]


def upload(array: np.ndarray, dev) -> torch.Tensor:
    """A host array on device `dev`, in its dtype and shape, through pinned memory and a copy
    that does not wait for the device (a pageable copy would stall the host behind every
    kernel launched before it)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if torch.device(dev).type == "cuda":
        host = host.pin_memory()
    return host.to(dev, non_blocking=True)


def to_device(arrays: list[np.ndarray], dev) -> list[torch.Tensor]:
    """Host integer arrays as device int64 tensors of their shapes, in one upload."""
    flat = [np.ascontiguousarray(a, dtype=np.int64).ravel() for a in arrays]
    on_dev = upload(np.concatenate(flat) if flat else np.zeros(0, np.int64), dev)
    out, at = [], 0
    for a, f in zip(arrays, flat):
        out.append(on_dev[at:at + f.size].view(np.shape(a)))
        at += f.size
    return out
