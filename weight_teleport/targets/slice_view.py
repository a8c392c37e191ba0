"""A worker's slice of a checkpoint tensor, seen in walk order on the worker's own tensor
(CPU or CUDA): the elements a sliced receiver stages against, and the pause's scatter.

`rows` slices are one contiguous range of the parameter (whole rows: fused qkv_proj /
gate_up_proj parts, column- and vocab-parallel shards), so staging reads them in place.
`cols` slices (row-parallel shards) are a column block: its walk is the block transposed,
a strided view; `gather_walk` copies it into one contiguous buffer of the slice's size."""

import torch

from weight_teleport.codec.dtypes import BY_TORCH
from weight_teleport.targets.vllm_layout import Slice


def _check(param: torch.Tensor, s: Slice) -> None:
    if tuple(param.shape) != s.param_shape or not param.is_contiguous():
        raise ValueError(f"{s.param!r} is {tuple(param.shape)} (contiguous: {param.is_contiguous()}), "
                         f"the layout expects a contiguous {s.param_shape}")


def walk_view(param: torch.Tensor, s: Slice) -> torch.Tensor:
    """The slice's elements in walk order, as a view of `param`: 1-D for `rows`, a 2-D
    strided [columns, rows] view (row-major = the walk) for `cols`."""
    _check(param, s)
    n = s.hi - s.lo
    if s.order == "rows":
        return param.view(-1)[s.dest * s.inner:(s.dest + n) * s.inner]
    return param[:, s.dest:s.dest + n].t()


def gather_walk(param: torch.Tensor, s: Slice) -> torch.Tensor:
    """The slice's elements in walk order, 1-D contiguous (a view for `rows`, a copy for `cols`)."""
    view = walk_view(param, s)
    return view if view.dim() == 1 else view.contiguous().view(-1)


def local_indices(s: Slice, positions: torch.Tensor) -> torch.Tensor:
    """Row-major flat indices in the parameter of walk positions `positions` (int64, inside
    the slice's walk range: the caller's chunks lie inside it)."""
    line, within = torch.div(positions - s.walk[0], s.inner, rounding_mode="floor"), \
        torch.remainder(positions - s.walk[0], s.inner)
    if s.order == "rows":
        return (line + s.dest) * s.inner + within
    return within * s.param_shape[1] + s.dest + line


def scatter_walk(param: torch.Tensor, s: Slice, positions: torch.Tensor, bits: torch.Tensor) -> None:
    """Write bit patterns `bits` (the dtype's integer width) at walk positions `positions`
    of the slice into `param`, in place: the pause's only work for this tensor."""
    _check(param, s)
    flat = param.view(-1).view(BY_TORCH[param.dtype].int_torch)
    if bits.dtype != flat.dtype:
        raise ValueError(f"bit patterns of {bits.dtype} do not fit {s.param!r} ({param.dtype})")
    start, stop = s.walk
    if positions.numel() and (int(positions.min()) < start or int(positions.max()) >= stop):
        raise IndexError(f"a walk position lies outside {s.name!r}'s slice [{start}, {stop})")
    flat[local_indices(s, positions.to(flat.device))] = bits.to(flat.device)
