"""A patch staged on the GPU: what `apply` writes, already verified against its digests."""

import dataclasses
from dataclasses import dataclass, field

import numpy as np
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


def _moved(
    at: torch.Tensor, addresses: dict[str, int], base: str, nbytes: int, to: dict[str, int]
) -> tuple[torch.Tensor, str]:
    """Element offsets `at` (from `base`'s first element, each inside one member of
    `addresses`) as offsets from the lowest of the members' new addresses `to`, each kept at
    its place in its member; (offsets, the new base)."""
    names = sorted(addresses, key=addresses.__getitem__)
    new_base = min(names, key=to.__getitem__)
    old = torch.tensor([(addresses[n] - addresses[base]) // nbytes for n in names], device=at.device)
    new = torch.tensor([(to[n] - to[new_base]) // nbytes for n in names], device=at.device)
    member = torch.searchsorted(old, at, right=True) - 1
    return at + (new - old)[member], new_base


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

    def arrays(self) -> list[torch.Tensor]:
        return [self.rows, self.offsets, self.values]

    def moved(self, to: dict[str, int]) -> "FusedGroup":
        """The same changes written into members now at addresses `to`."""
        first, base = _moved(
            self.rows[:, 0].contiguous().to(self.values.device),
            self.addresses,
            self.base,
            self.values.element_size(),
            to,
        )
        rows = self.rows.to(self.values.device).clone()
        rows[:, 0] = first
        return dataclasses.replace(self, base=base, addresses={n: to[n] for n in self.addresses}, rows=rows)


@dataclass
class WalkGroup(FusedGroup):
    """Changes of tensors of one element type whose walks are 2-D views that are not
    contiguous (column-parallel shards walked by columns), written where they lie in
    memory from the batch's int32 offsets in chunks (shared with its `FusedGroup`), with a
    row per scatter program ([programs, stage_scatter.WALK_ROW] int64) whose first column
    is its member's first element from the base's and whose last ones its walk's geometry
    (`stage_scatter.scatter_walks`)."""


@dataclass
class ScatterGroup:
    """Changes of tensors of one element type that are not contiguous and whose walks are
    not 2-D views (else `WalkGroup`), written where they lie in memory: int64 offsets from
    the base's first element."""

    base: str
    addresses: dict[str, int]
    offsets: torch.Tensor
    values: torch.Tensor

    def arrays(self) -> list[torch.Tensor]:
        return [self.offsets, self.values]

    def moved(self, to: dict[str, int]) -> "ScatterGroup":
        offsets, base = _moved(
            self.offsets.to(self.values.device), self.addresses, self.base, self.values.element_size(), to
        )
        return ScatterGroup(base, {n: to[n] for n in self.addresses}, offsets, self.values)


@dataclass
class DevicePatch:
    kind: str
    version: int
    base_version: int | None
    tensors: list[DeviceTensorPatch]
    base_checked: bool
    groups: list[FusedGroup | WalkGroup | ScatterGroup] = field(default_factory=list)
    walks: dict = field(default_factory=dict)
    """Records over boxes or walked by columns, as `codec.patch.StagedPatch.walks`."""
    windows: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Records staged in part: name -> (offset, count, origin) of the live tensor's flat
    walk that the patch writes (`Live.narrowed`); apply narrows the tensor alike."""

    @property
    def changed(self) -> int:
        return sum(t.changed + sum(v.numel() for _, v in t.dense) for t in self.tensors)

    @property
    def nbytes(self) -> int:
        """Memory held by the staged patch."""
        arrays = [a for g in self.groups for a in g.arrays()]
        for t in self.tensors:
            arrays += [a for a in (t.positions, t.values) if a is not None] + [v for _, v in t.dense]
        unique = {id(a): a for a in arrays}  # a batch's groups share its offsets and values
        return sum(a.numel() * a.element_size() for a in unique.values())

    def offload(self) -> "DevicePatch":
        """Move the patch to pinned host memory (when device memory is short); apply copies
        it back. Returns self."""
        pinned: dict[int, torch.Tensor] = {}

        def pin(a: torch.Tensor) -> torch.Tensor:  # once each: a batch's groups share its offsets and values
            if id(a) not in pinned:
                pinned[id(a)] = a.cpu().pin_memory()
            return pinned[id(a)]

        for g in self.groups:
            for f in dataclasses.fields(g):
                if isinstance(getattr(g, f.name), torch.Tensor):
                    setattr(g, f.name, pin(getattr(g, f.name)))
        for t in self.tensors:
            if t.positions is not None:
                assert t.values is not None  # set with the positions
                t.positions, t.values = pin(t.positions), pin(t.values)
            t.dense = [(s, pin(v)) for s, v in t.dense]
        return self

    @classmethod
    def of_host(cls, staged) -> "DevicePatch":
        """A patch the CPU backend staged (against a host copy of CUDA weights) in this
        backend's form: its changes as positions and values in pinned host memory, which
        `apply` copies to the device."""
        tensors = []
        for t in staged.tensors:
            signed = np.dtype(f"<i{t.info.nbytes}") if t.info.nbytes > 1 else np.dtype(np.uint8)
            pin = lambda a: torch.from_numpy(np.ascontiguousarray(a)).pin_memory()
            sparse = [c for c in t.chunks if c.positions is not None]
            patch = DeviceTensorPatch(
                t.name,
                t.info,
                t.shape,
                t.digest,
                changed=sum(c.values.size for c in sparse),
                dense=[(c.start, pin(c.values.view(signed))) for c in t.chunks if c.positions is None],
            )
            if sparse:
                patch.positions = pin(np.concatenate([c.positions.astype(np.int64) + c.start for c in sparse]))
                patch.values = pin(np.concatenate([c.values for c in sparse]).view(signed))
            tensors.append(patch)
        return cls(staged.kind, staged.version, staged.base_version, tensors, staged.base_checked, walks=staged.walks)

    def moved(self, to: dict[str, int]) -> "DevicePatch":
        """The patch written into tensors of the same shapes and contents as those it was
        staged against, now at addresses `to` (name -> data_ptr of each group member): a
        patch staged against a copy of the weights, applied to the weights."""
        return dataclasses.replace(self, groups=[g.moved(to) for g in self.groups])
