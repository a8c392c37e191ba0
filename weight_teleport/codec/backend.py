"""The interface every codec backend implements, and the one function that picks one.

A backend is a module (`codec/cpu/backend.py`, `codec/cuda/backend.py`, imported on first
use through codec/registry.py) holding these functions; `codec/api.py` checks the caller's
arguments, builds the walk views and writes the container, and asks the backend of the
tensors' device for the rest. What a backend cannot do (the CPU backend: GPU-only stream
codecs) it refuses with the error a user can act on, here and nowhere else."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import torch

from weight_teleport.codec import registry
from weight_teleport.codec.dtypes import DtypeInfo
from weight_teleport.codec.items import Encoded, EncodeItem
from weight_teleport.codec.patch import StagedPatch
from weight_teleport.codec.walks import Hint, TensorSlice
from weight_teleport.format import PackHeader


@runtime_checkable
class Backend(Protocol):
    """The functions `codec/api.py` calls on a backend (module-level functions)."""

    Live: Callable[[torch.Tensor, DtypeInfo], Any]
    """`Live(tensor, info)`: a live tensor as the backend's stage and apply read it (a walk
    view of the caller's tensor for records over boxes)."""

    def item(self, name: str, info: DtypeInfo, new: torch.Tensor, old: torch.Tensor | None) -> EncodeItem:
        """The encode item of a whole tensor (and of its base; None for snapshots)."""

    def walk_item(
        self,
        name: str,
        info: DtypeInfo,
        new: torch.Tensor,
        old: torch.Tensor | None,
        sl: TensorSlice,
        hint: Hint,
        chunk_elems: int,
    ) -> EncodeItem:
        """The encode item of a record over a walk: `new` and `old` are views of the box
        `sl` whose row-major order is `hint.order`'s walk (`walks.whole_walk`), which the
        backend flattens; the record is cut where `hint.bounds` fall and carries a
        digest per chunk."""

    def encode(
        self,
        items: list[EncodeItem],
        chunk_elems: int,
        level: int,
        threads: int | None,
        config: Any,
        pinned: bool,
        codec: str,
    ) -> Encoded:
        """The records and chunks of `items`. `config`: the caller's `cuda` argument
        (ValueError where the backend takes none); `pinned`: the pack goes to pinned host
        memory; `codec`: the codec of the sparse records (`registry.CHOICES`)."""

    def check_stage(self, header: PackHeader, windows: dict) -> None:
        """UnsupportedFormatError unless this backend stages the pack of `header`: its
        stream codecs, and records staged in part (`windows`)."""

    def stage(
        self, lives: dict, header: PackHeader, pack, check_base: bool, threads: int | None, windows: dict, config: Any
    ) -> StagedPatch:
        """Decode and verify the records named in `lives` against them; nothing is written.
        `windows`: as `_lives` in codec/api.py makes them; `config`: the caller's `cuda`
        argument (ValueError where the backend takes none)."""

    def bind(self, lives: dict, staged: StagedPatch, threads: int | None, relocate: bool = False) -> Callable[[], None]:
        """The writes of a patch staged by this backend into the live tensors, as a function
        (the pause calls it), its host work (views, address checks, relocation) done now.
        `relocate`: the lives hold the weights the patch was staged against, possibly
        elsewhere in memory (a patch staged against a copy); else a backend whose patches
        hold addresses refuses tensors that moved."""

    def digest(self, tensor: torch.Tensor) -> str:
        """The pack digest of a tensor's bytes, in hex."""

    def digests(self, tensors: list[torch.Tensor]) -> list[str]:
        """`digest` of each tensor."""


def backend_of(tensors: Iterable[torch.Tensor]) -> Backend:
    """The backend of the tensors' device type: CPU, or CUDA (CUDA C and Triton kernels).
    Read from `is_cpu` and `is_cuda`: `t.device` makes a new object per tensor, and this
    runs over every tensor of both states per call."""
    tensors = list(tensors)
    if all(t.is_cpu for t in tensors):
        return registry.backend("cpu")
    if all(t.is_cuda for t in tensors):
        return registry.backend("cuda")
    types = sorted({t.device.type for t in tensors})
    raise ValueError(f"tensors are on {types}; keep a whole state on the CPU or on CUDA devices")
