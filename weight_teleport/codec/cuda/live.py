"""Live CUDA weights as the kernels read them, and the items the encoder takes."""

from dataclasses import dataclass
from functools import cached_property

import torch

from weight_teleport.codec.dtypes import DtypeInfo, contiguous


def grouped(items, key) -> list[list]:
    """`items` grouped by key(item), in their order within a group. Batches of the CUDA
    backend group by dtype (`info.name`): types of one width differ in bit layout."""
    groups: dict = {}
    for x in items:
        groups.setdefault(key(x), []).append(x)
    return list(groups.values())


def flat_bits(tensor: torch.Tensor, info: DtypeInfo) -> torch.Tensor:
    """The bit patterns of a tensor as a flat integer tensor (a view when contiguous)."""
    return contiguous(tensor).view(info.int_torch).view(-1)


class Live:
    """A live tensor and its flat bit patterns (a view when contiguous, else a copy), made
    on first use: the pause touches only the tensors it writes."""

    def __init__(self, tensor: torch.Tensor, info: DtypeInfo):
        self.tensor, self.info = tensor, info

    @cached_property
    def u(self) -> torch.Tensor:
        return flat_bits(self.tensor, self.info)

    @property
    def in_place(self) -> bool:
        """Whether writing `u` writes the tensor itself."""
        return self.tensor.is_contiguous()

    def commit(self) -> None:
        """Write a patched copy back into a non-contiguous tensor."""
        if not self.in_place:
            self.tensor.view(self.info.int_torch).copy_(self.u.view(self.tensor.shape))


@dataclass
class EncodeItem:
    name: str
    info: DtypeInfo
    shape: tuple[int, ...]
    new: torch.Tensor
    """The new tensor's bits in a contiguous tensor of any dtype of their width (the caller's
    tensor itself when it is contiguous), on the device: the kernels read them through the
    chunk table's pointers, and only its base gets a flat view (`flat_bits`)."""
    old: torch.Tensor | None
    """The same of the base tensor; None for snapshots."""

    @classmethod
    def of(cls, name: str, info: DtypeInfo, new: torch.Tensor, old: torch.Tensor | None) -> "EncodeItem":
        """An item of the caller's tensors, with no torch call on a contiguous one: a flat
        view costs four torch dispatches, and for every tensor of a large state they would be
        the encode call's first milliseconds of host work, before any launch."""
        return cls(name, info, tuple(new.shape), _bits(new, info), None if old is None else _bits(old, info))


def _bits(tensor: torch.Tensor, info: DtypeInfo) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else flat_bits(tensor, info)
