"""Applying a staged patch: the only step that writes live weights (the sampler's pause)."""

import torch

from weight_teleport.codec.cuda.live import Live
from weight_teleport.codec.cuda.stage.patch import DevicePatch
from weight_teleport.codec.cuda.kernels.stage_scatter import scatter, scatter_chunks


def _check_addresses(lives: dict[str, Live], staged: DevicePatch) -> None:
    for g in staged.groups:
        for name, ptr in g.addresses.items():
            if lives[name].tensor.data_ptr() != ptr:
                raise ValueError(f"tensor {name!r} moved in memory since the patch was staged; "
                                 "stage the pack again against the state it is applied to")


def _device(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(like.device, non_blocking=True) if t.device != like.device else t


def apply(lives: dict[str, Live], staged: DevicePatch, threads: int | None = None) -> None:
    """Write a staged patch into the live weights: one scatter per element type for all
    contiguous tensors, then whole-chunk copies and non-contiguous tensors."""
    _check_addresses(lives, staged)
    for g in staged.groups:
        base = lives[g.base].u
        scatter_chunks(base, _device(g.rows, base), _device(g.offsets, base), _device(g.values, base))
    for t in staged.tensors:
        if t.fused:
            continue
        live = lives[t.name]
        for start, values in t.dense:
            live.u[start:start + values.numel()].copy_(values, non_blocking=True)
        if t.positions is not None:
            scatter(live.u, _device(t.positions, live.u), _device(t.values, live.u))
        if t.chunks:
            live.commit()
