"""`TorchTarget`: live weights held by a torch `nn.Module` or a plain mapping of tensors.

Checkpoint names are the module's `state_dict` names (with an optional prefix), so HF
transformers models work as they are: tied weights (lm_head / embed_tokens sharing one
parameter) appear under both names and are patched once per name with equal values;
buffers that a checkpoint does not publish are left alone. Weights that all sit in CPU
memory or all on one CUDA device are lent to the subscriber as its checkpoint view: it
stages every pack against them where they are (on the GPU for CUDA weights) and keeps no
shadow copy. Weights spread over several devices are patched from a shadow copy's staged
patches, one indexed copy per chunk."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

import numpy as np
import torch

from weight_teleport.codec import StagedParts, StagedPatch, apply_staged
from weight_teleport.codec.patch import ChunkPatch, TensorPatch
from weight_teleport.errors import PackMismatchError
from weight_teleport.subscribe.target import Target


def _signed(values: np.ndarray) -> torch.Tensor:
    """A torch view of unsigned bit patterns (as the signed integer of the same width)."""
    if values.dtype.itemsize == 1:
        return torch.from_numpy(values)
    return torch.from_numpy(values.view(f"<i{values.dtype.itemsize}"))


class TorchTarget(Target):
    """Patches the tensors of `weights` (an `nn.Module` or a name -> tensor mapping) in place.

    `prefix` is prepended to the module's names to form checkpoint names (e.g. "model."
    when the target is the inner decoder of a model whose checkpoint names start so)."""

    def __init__(self, weights: torch.nn.Module | MutableMapping[str, torch.Tensor], prefix: str = ""):
        named: Iterable[tuple[str, torch.Tensor]]
        if isinstance(weights, torch.nn.Module):
            named = weights.state_dict(keep_vars=True).items()
        else:
            named = weights.items()
        self.tensors: dict[str, torch.Tensor] = {
            prefix + k: t.data if isinstance(t, torch.nn.Parameter) else t for k, t in named
        }
        """Checkpoint name -> live tensor (tied names share one tensor)."""

    def checkpoint_view(self) -> Mapping[str, torch.Tensor] | None:
        """The live tensors themselves when they all sit in CPU memory or all on one CUDA
        device; None when they are spread over several devices."""
        devices = {t.device for t in self.tensors.values()}
        return self.tensors if len(devices) <= 1 else None

    def _live(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise PackMismatchError(
                f"the target has no tensor {name!r} (it has "
                f"{len(self.tensors)}, e.g. {next(iter(self.tensors), None)!r});"
                " pass TorchTarget(prefix=...) if the names differ by a prefix"
            ) from None

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy a full checkpoint-layout state into the live tensors."""
        for name, t in state.items():
            live = self._live(name)
            if live.shape != t.shape or live.dtype != t.dtype:
                raise PackMismatchError(
                    f"tensor {name!r} is {tuple(live.shape)} {live.dtype} in "
                    f"the target but {tuple(t.shape)} {t.dtype} in the state"
                )
        with torch.no_grad():
            for name, t in state.items():
                self.tensors[name].copy_(t)

    def apply(self, staged: StagedPatch | StagedParts) -> None:
        """Write the staged patch: the codec's scatter into the lent view, else indexed
        copies of a shadow's patch into tensors on several devices."""
        for t in staged.tensors:
            self._live(t.name)
        if self.checkpoint_view() is not None:
            apply_staged(self.tensors, staged)
            return
        with torch.no_grad():
            for t in staged.tensors:
                for chunk in t.chunks:
                    self._apply_chunk(self.tensors[t.name], t, chunk)

    @staticmethod
    def _apply_chunk(live: torch.Tensor, tensor: TensorPatch, chunk: ChunkPatch) -> None:
        flat = live.view(tensor.info.int_torch).view(-1)
        values = _signed(chunk.values).to(live.device, non_blocking=True)
        if chunk.positions is None:
            flat[chunk.start : chunk.start + values.numel()].copy_(values)
        else:
            index = torch.from_numpy(chunk.positions.astype(np.int64)).to(live.device)
            flat.index_copy_(0, index.add_(chunk.start), values)
