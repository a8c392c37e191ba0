"""The subscriber's staging step: decode one checked object against the weights it
applies to, without touching the target.

Two modes: with a checkpoint view (the target's own CPU tensors) one version at a time
is staged against the live weights; without one, a shadow copy is advanced in the
background and any number of staged versions queue up for `apply`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedPatch, apply_staged, stage_delta
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.format import read_header
from weight_teleport.pipeline.manifest import Entry


def _empty_like_pack(pack: bytes) -> dict[str, torch.Tensor]:
    header = read_header(pack)
    return {t.name: torch.empty(t.shape, dtype=BY_NAME[t.dtype].torch_dtype)
            for t in header.tensors}


class Stager:
    """Where staged patches are decoded: the target's view, or a shadow copy."""

    def __init__(self, view: Mapping[str, torch.Tensor] | None, threads: int | None,
                 device_budget: int | None = None, decompress_backend: str = "default"):
        self.view = view
        self.shadow: dict[str, torch.Tensor] | None = None
        self.threads = threads
        self.device_budget = device_budget
        self.cuda = CudaCodecConfig(decompress_backend=decompress_backend)
        """The CUDA decoder's configuration, for CUDA targets (ValueError here for an unknown backend)."""

    @property
    def uses_view(self) -> bool:
        return self.view is not None

    @property
    def on_cuda(self) -> bool:
        """Whether packs are staged onto CUDA weights (then they are fetched into pinned
        memory, which the stage copies to the device from where it is)."""
        return self.uses_view and any(t.is_cuda for t in self.view.values())

    def stage(self, entry: Entry, pack: bytes, head: int | None) -> StagedPatch:
        """Decode and verify `pack` against the weights at version `head` (raises the
        codec's typed errors when they are not the pack's base). In shadow mode the
        shadow moves to the pack's version."""
        base = self.view if self.uses_view else self.shadow
        options = dict(strict=False, threads=self.threads, device_budget=self.device_budget,
                       cuda=self.cuda if self.on_cuda else None)
        if entry.kind == "delta":
            assert base is not None, "plans from no weights start with a snapshot"
            staged = stage_delta(base, pack, base_version=head, **options)
        else:
            target = base if self.uses_view else _empty_like_pack(pack)
            staged = stage_delta(target, pack, **options)
            if not self.uses_view:
                self.shadow = target
        if not self.uses_view:
            apply_staged(self.shadow, staged, self.threads)
        return staged
