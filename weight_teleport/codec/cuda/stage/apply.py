"""Applying a staged patch: the only step that writes live weights (the sampler's pause)."""

import torch

from weight_teleport.codec.cuda.live import Live, storage_view
from weight_teleport.codec.cuda.stage.patch import DevicePatch, FusedGroup
from weight_teleport.codec.cuda.kernels.stage_scatter import scatter, scatter_chunks


def _addresses(lives: dict[str, Live], staged: DevicePatch) -> dict[str, int]:
    return {name: lives[name].tensor.data_ptr() for g in staged.groups for name in g.addresses}


def _check_addresses(found: dict[str, int], staged: DevicePatch) -> None:
    for g in staged.groups:
        for name, ptr in g.addresses.items():
            if found[name] != ptr:
                raise ValueError(f"tensor {name!r} moved in memory since the patch was staged; "
                                 "stage the pack again against the state it is applied to")


def _device(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(like.device, non_blocking=True) if t.device != like.device else t


def apply(lives: dict[str, Live], staged: DevicePatch, threads: int | None = None, relocate: bool = False) -> None:
    """Write a staged patch into the live weights: one scatter per element type for all
    contiguous tensors, one for all walk views by columns, then whole-chunk copies.
    `relocate`: the lives hold the weights the patch was staged against but may lie
    elsewhere in memory (a patch staged against a copy); else tensors that moved are refused."""
    lives = {name: live.narrowed(*staged.windows[name]) if name in staged.windows else live
             for name, live in lives.items()}
    found = _addresses(lives, staged)
    if relocate:
        staged = staged.moved(found)
    _check_addresses(found, staged)
    for g in staged.groups:
        base = lives[g.base]
        if isinstance(g, FusedGroup):
            scatter_chunks(base.u, _device(g.rows, base.u), _device(g.offsets, base.u), _device(g.values, base.u))
        else:
            flat = storage_view(base.tensor, base.info)
            scatter(flat, _device(g.offsets, flat), _device(g.values, flat))
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
