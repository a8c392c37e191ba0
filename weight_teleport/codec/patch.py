"""A staged patch: a decoded, verified pack, ready to be written into live weights."""

from dataclasses import dataclass, field

import numpy as np

from weight_teleport.codec.dtypes import DtypeInfo
from weight_teleport.errors import PackFormatError


class ChunkMisfit(PackFormatError):
    """A sparse chunk's changes do not fit the receiver's weights: the pack's streams are
    corrupt, or the weights are not the pack's base (their digests tell which)."""


def misfit(base_version: int | None, base_checked: bool) -> PackFormatError:
    """The error of a sparse chunk that does not fit weights whose base digests matched
    the pack's (`base_checked`), or were not compared with them."""
    if base_checked:
        return ChunkMisfit(
            "sparse chunk does not fit the receiver's weights, which are the "
            "pack's base (their digests match): the pack's streams are corrupt"
        )
    return ChunkMisfit(
        f"sparse chunk does not fit the receiver's weights: they are likely not "
        f"the weights of the pack's base version {base_version} (the base "
        f"digest check was skipped: check_base=False), else the pack is corrupt"
    )


@dataclass
class ChunkPatch:
    start: int
    """First element of the chunk in the flattened tensor."""
    positions: np.ndarray | None
    """Offsets (from `start`, ascending) of the changed elements; None when `values` covers
    the whole chunk (dense chunks and snapshots)."""
    values: np.ndarray
    """New bit patterns (unsigned integers of the tensor's width)."""


@dataclass
class TensorPatch:
    name: str
    info: DtypeInfo
    shape: tuple[int, ...]
    digest: int
    """Digest of the tensor once patched."""
    chunks: list[ChunkPatch] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(c.values.size if c.positions is None else c.positions.size for c in self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(c.values.nbytes + (0 if c.positions is None else c.positions.nbytes) for c in self.chunks)


@dataclass
class StagedPatch:
    kind: str
    version: int
    base_version: int | None
    tensors: list[TensorPatch]
    base_checked: bool
    """Whether the live weights were checked against the pack's base digests while staging."""
    walks: dict = field(default_factory=dict)
    """name -> (held box, staged box, order) of records over boxes: `apply_staged` writes
    them through the same walk views (codec/walks.py)."""

    @property
    def changed(self) -> int:
        return sum(t.changed for t in self.tensors)

    @property
    def nbytes(self) -> int:
        """Memory held by the staged patch."""
        return sum(t.nbytes for t in self.tensors)

    def offload(self) -> "StagedPatch":
        """Move the patch to host memory: it is there already. Returns self."""
        return self


@dataclass
class ApplyReport:
    version: int
    base_version: int | None
    kind: str
    tensors_patched: int
    elements_changed: int
    """Elements written: the changed ones of sparse chunks, every element of dense chunks
    (those tensors changed too much for positions to pay)."""
    pack_bytes: int
    base_checked: bool
    digest_verified: bool
    """The result's digests were checked (before any weight was written)."""
    stage_seconds: float
    apply_seconds: float


@dataclass
class StagedParts:
    """The staged patches of the parts of one version (packs over disjoint boxes of the
    same tensors, from several writers): `apply_staged` writes them all."""

    patches: list[StagedPatch]

    @property
    def kind(self) -> str:
        return self.patches[0].kind

    @property
    def version(self) -> int:
        return self.patches[0].version

    @property
    def base_version(self) -> int | None:
        return self.patches[0].base_version

    @property
    def base_checked(self) -> bool:
        return all(p.base_checked for p in self.patches)

    @property
    def tensors(self) -> list[TensorPatch]:
        return [t for p in self.patches for t in p.tensors]

    @property
    def changed(self) -> int:
        return sum(p.changed for p in self.patches)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.patches)

    def offload(self) -> "StagedParts":
        self.patches = [p.offload() for p in self.patches]
        return self
