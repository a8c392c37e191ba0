"""Applying a staged patch: the only step that writes live weights (the sampler's pause).

`bind` does the host's work first (the tensors a patch writes narrowed to its windows, their
addresses checked, a patch staged elsewhere moved onto them) and returns the function that
writes: a sampler can bind before its pause, which then only launches the writes."""

from collections.abc import Callable

import torch

from weight_teleport.codec.cuda.live import Live, storage_view
from weight_teleport.codec.cuda.stage.patch import DevicePatch, FusedGroup, WalkGroup
from weight_teleport.codec.cuda.kernels.stage_scatter import scatter, scatter_chunks, scatter_walks


def _address(live: Live, window) -> int:
    """The data_ptr of `live` narrowed to `window` ((offset, count, origin) or None), without
    making the view: a contiguous tensor moves by the offset, a strided one stays."""
    if window is not None and live.tensor.is_contiguous():
        return (
            live.tensor.data_ptr() + (window[0] + (live.window[0] if live.window else 0)) * live.tensor.element_size()
        )
    return live.tensor.data_ptr()


def _check_addresses(found: dict[str, int], staged: DevicePatch) -> None:
    for g in staged.groups:
        for name, ptr in g.addresses.items():
            if found[name] != ptr:
                raise ValueError(
                    f"tensor {name!r} moved in memory since the patch was staged; "
                    "stage the pack again against the state it is applied to"
                )


def _device(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(like.device, non_blocking=True) if t.device != like.device else t


def bind(
    lives: dict[str, Live], staged: DevicePatch, threads: int | None = None, relocate: bool = False
) -> Callable[[], None]:
    """The writes of a staged patch into the live weights, as a function to call in the
    pause: one scatter per element type for all contiguous tensors, one for all 2-D walk
    views that are not (column-parallel shards), one for any other strided views, then
    whole-chunk copies. `relocate`: the lives hold the weights the patch
    was staged against but may lie elsewhere in memory (a patch staged against a copy);
    else tensors that moved are refused (ValueError, here)."""
    found = {name: _address(lives[name], staged.windows.get(name)) for g in staged.groups for name in g.addresses}
    if relocate:
        staged = staged.moved(found)
    _check_addresses(found, staged)
    narrow = lambda name: lives[name].narrowed(*staged.windows[name]) if name in staged.windows else lives[name]
    writes = []
    for g in staged.groups:
        base = narrow(g.base)
        if isinstance(g, WalkGroup):  # before FusedGroup, which it extends
            flat = storage_view(base.tensor, base.info)
            writes.append(
                lambda g=g, flat=flat: scatter_walks(
                    flat, _device(g.rows, flat), _device(g.offsets, flat), _device(g.values, flat)
                )
            )
        elif isinstance(g, FusedGroup):
            writes.append(
                lambda g=g, u=base.u: scatter_chunks(u, _device(g.rows, u), _device(g.offsets, u), _device(g.values, u))
            )
        else:
            flat = storage_view(base.tensor, base.info)
            writes.append(lambda g=g, flat=flat: scatter(flat, _device(g.offsets, flat), _device(g.values, flat)))
    for t in staged.tensors:
        if not t.fused and t.chunks:
            writes.append(lambda t=t, live=narrow(t.name): _write_tensor(live, t))

    def write() -> None:
        for w in writes:
            w()

    return write


def _write_tensor(live: Live, t) -> None:
    for start, values in t.dense:
        live.u[start : start + values.numel()].copy_(values, non_blocking=True)
    if t.positions is not None:
        scatter(live.u, _device(t.positions, live.u), _device(t.values, live.u))
    live.commit()
