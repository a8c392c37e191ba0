"""Live CUDA weights as the kernels read them, and the items the encoder takes."""

from functools import cached_property

import torch

from weight_teleport.codec.cuda.kernels.stage_scatter import scatter
from weight_teleport.codec.cuda.kernels.walk_copy import copy_walk
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.dtypes import DtypeInfo, contiguous
from weight_teleport.codec.items import EncodeItem


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
    """A live tensor and its flat bit patterns (`walk_bits`: a view when contiguous, else a
    copy of the staged window), made on first use: the pause touches only the tensors it
    writes.

    `origin`: where the tensor's first element lies in its record's walk (a receiver
    holding some chunks of a record: the digest numbers words by their place in the walk).
    `window`: (offset, count) of the tensor's flat walk that is staged, for a tensor that
    is not contiguous (a contiguous one is narrowed by a view: `narrowed`)."""

    def __init__(self, tensor: torch.Tensor, info: DtypeInfo, origin: int = 0, window: tuple[int, int] | None = None):
        self.tensor, self.info, self.origin, self.window = tensor, info, origin, window

    @cached_property
    def u(self) -> torch.Tensor:
        return walk_bits(self.tensor, self.info, *(self.window or (0, None)))

    @property
    def in_place(self) -> bool:
        """Whether writing `u` writes the tensor itself."""
        return self.tensor.is_contiguous()

    def narrowed(self, offset: int, count: int, origin: int) -> "Live":
        """Elements [offset, offset + count) of this tensor's flat walk, whose first lies at
        `origin` of its record's walk."""
        if self.window is not None:
            offset += self.window[0]
        if self.tensor.is_contiguous():
            return Live(self.tensor.reshape(-1)[offset : offset + count], self.info, origin)
        return Live(self.tensor, self.info, origin, (offset, count))

    def storage_offsets(self, positions: torch.Tensor) -> torch.Tensor:
        """Offsets (int64, from the tensor's first element in memory) of flat walk
        positions `positions` of a tensor that is not contiguous: where a scatter writes
        them in place, with no copy of the tensor."""
        if self.window is not None:
            positions = positions + self.window[0]
        out = torch.zeros_like(positions)
        for size, stride in zip(reversed(self.tensor.shape), reversed(self.tensor.stride())):
            out += (positions % size) * stride
            positions = positions // size
        return out

    def commit(self) -> None:
        """Write a patched copy back into a non-contiguous tensor."""
        if not self.in_place:
            every = torch.arange(self.u.numel(), device=self.u.device)
            scatter(storage_view(self.tensor, self.info), self.storage_offsets(every), self.u)


def walk_bits(tensor: torch.Tensor, info: DtypeInfo, start: int = 0, count: int | None = None) -> torch.Tensor:
    """Elements [start, start + count) of the flat walk (row-major order) of `tensor`'s bit
    patterns, to its end where `count` is None: a view where the tensor is contiguous, else a
    copy of that run alone, made by tiles (`walk_copy`) where the walk is a 2-D view of
    memory (a column block walked by columns: an element-wise copy would read a sector per
    element)."""
    if tensor.is_contiguous():
        flat = flat_bits(tensor, info)
        if start == 0 and count is None:
            return flat
        return flat[start:] if count is None else flat[start : start + count]
    bits = tensor.detach().view(info.int_torch)
    count = tensor.numel() - start if count is None else count
    geometry = walk_2d(tensor) if memory.on_device(tensor) else None
    if geometry is None:
        return bits.contiguous().view(-1)[start : start + count]
    return copy_walk(bits, torch.empty(count, dtype=bits.dtype, device=bits.device), start, geometry)


def walk_2d(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """(inner extent, outer stride, inner stride) of a tensor whose flat walk is a 2-D view
    of memory once dimensions of one element are dropped and those laid end to end are
    merged (a block of columns, or its transpose): flat position p lies at element
    (p // inner) * outer stride + (p % inner) * inner stride from its first. None for
    other layouts."""
    dims: list[list[int]] = []
    for size, stride in zip(tensor.shape, tensor.stride()):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    if len(dims) > 2:
        return None
    if len(dims) < 2:
        dims = [[1, 0]] + (dims or [[1, 1]])
    return dims[1][0], dims[0][1], dims[1][1]


def storage_view(tensor: torch.Tensor, info: DtypeInfo) -> torch.Tensor:
    """A flat integer view from `tensor`'s first element in memory over every element of
    it, whatever its strides (the base a scatter of `Live.storage_offsets` writes into)."""
    span = 1 + sum((d - 1) * s for d, s in zip(tensor.shape, tensor.stride())) if tensor.numel() else 0
    return tensor.view(info.int_torch).as_strided((span,), (1,))


def encode_item(
    name: str, info: DtypeInfo, new: torch.Tensor, old: torch.Tensor | None, cuts=None, chunk_digests: bool = False
) -> EncodeItem:
    """An item of the caller's tensors (`EncodeItem.new`: the tensor itself where it is
    contiguous, else its flat bits), with no torch call on a contiguous one: a flat view
    costs four torch dispatches, and for every tensor of a large state they would be the
    encode call's first milliseconds of host work, before any launch. The kernels read the
    bits through the chunk table's pointers; only its base gets a flat view (`flat_bits`)."""
    return EncodeItem(
        name, info, tuple(new.shape), _bits(new, info), None if old is None else _bits(old, info), cuts, chunk_digests
    )


def _bits(tensor: torch.Tensor, info: DtypeInfo) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else flat_bits(tensor, info)
