"""A patch staged on the GPU: what `apply` writes, already verified against its digests."""

from dataclasses import dataclass, field

import torch

from weight_teleport.codec.dtypes import DtypeInfo


@dataclass
class DeviceTensorPatch:
    name: str
    info: DtypeInfo
    shape: tuple[int, ...]
    digest: int
    """Digest of the tensor once patched."""
    changed: int = 0
    positions: torch.Tensor | None = None
    """Flat element indices (int64) of changed elements, when not patched in place (then
    its changes sit in the patch's fused group of its element type)."""
    values: torch.Tensor | None = None
    """Their new bit patterns (the dtype's integer type)."""
    dense: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(first element, new bit patterns) of whole chunks (dense codecs and snapshots)."""
    fused: bool = False
    """Its changes sit in the patch's fused group of its element type (patched in place)."""

    @property
    def chunks(self) -> bool:
        """Whether applying the patch writes into this tensor."""
        return self.changed > 0 or bool(self.dense)


@dataclass
class FusedGroup:
    """Changes of several contiguous tensors of one element type, addressed from one base:
    4-byte offsets in their chunks, and a row per scatter program naming its chunk."""
    base: str
    """Name of the tensor chunk positions count from (the lowest address of the group)."""
    addresses: dict[str, int]
    """data_ptr of each member at staging; apply refuses a state whose tensors moved."""
    rows: torch.Tensor
    """[programs, 3] int64: chunk's first element from the base's, first change, stop."""
    offsets: torch.Tensor
    """int32 offsets of the changes in their chunks."""
    values: torch.Tensor


@dataclass
class DevicePatch:
    kind: str
    version: int
    base_version: int | None
    tensors: list[DeviceTensorPatch]
    base_checked: bool
    groups: list[FusedGroup] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(t.changed + sum(v.numel() for _, v in t.dense) for t in self.tensors)

    @property
    def nbytes(self) -> int:
        """Memory held by the staged patch."""
        arrays = [a for g in self.groups for a in (g.rows, g.offsets, g.values)]
        for t in self.tensors:
            arrays += [a for a in (t.positions, t.values) if a is not None] + [v for _, v in t.dense]
        return sum(a.numel() * a.element_size() for a in arrays)

    def offload(self) -> "DevicePatch":
        """Move the patch to pinned host memory (when device memory is short); apply copies
        it back. Returns self."""
        pin = lambda a: a.cpu().pin_memory()
        for g in self.groups:
            g.rows, g.offsets, g.values = pin(g.rows), pin(g.offsets), pin(g.values)
        for t in self.tensors:
            if t.positions is not None:
                t.positions, t.values = pin(t.positions), pin(t.values)
            t.dense = [(s, pin(v)) for s, v in t.dense]
        return self
