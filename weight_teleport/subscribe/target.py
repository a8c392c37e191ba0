"""The target contract: checkpoint names and flat element positions in, live weights patched.

A staged patch (weight_teleport.codec.StagedPatch) speaks the checkpoint's layout: for each
published tensor name, chunks of (start, positions, values), where start + positions are
flat row-major element indices into the checkpoint tensor and values are the new bit
patterns (unsigned integers of the dtype's width). Decoding needs the old weights in that
same layout, so the subscriber keeps them (its "shadow" copy) unless the target can lend
its own tensors (`checkpoint_view`). A target maps names and indices onto its live
parameters: fused projections, tensor-parallel shards, tied weights, name prefixes."""

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from weight_teleport.codec import StagedParts, StagedPatch


class Target(ABC):
    """A sampler's live weights."""

    def checkpoint_view(self) -> Mapping[str, torch.Tensor] | None:
        """Tensors in checkpoint layout that ARE the live weights (patched in place by
        `apply`), all in CPU memory or all on one CUDA device; None when the live weights
        have another layout or are spread over devices. When a view is given, the
        subscriber stages every pack against it where it lives (CUDA views on a side
        stream of their device) and keeps no shadow copy."""
        return None

    @abstractmethod
    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the live weights with a full checkpoint-layout state (cold start, resync)."""

    @abstractmethod
    def apply(self, staged: StagedPatch | StagedParts) -> None:
        """Write a staged patch into the live weights, in place. This is the sampler's pause:
        it must not allocate per element or touch unchanged weights. A version made of parts
        staged against the lent view comes as a `StagedParts` (`apply_staged` writes either).

        After `apply` (and `load`), nothing the sampler derived from the old weights may
        serve again, such as an engine's prefix cache of KV blocks: a target that owns the
        engine drops it here (`VllmTarget`). For a bare module (`TorchTarget`) that is the
        host's: HF's `generate` builds its KV cache per call, but `past_key_values` a host
        keeps across calls are stale."""
