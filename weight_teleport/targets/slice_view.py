"""A worker's slice of a checkpoint tensor, seen on the worker's own parameter (CPU or
CUDA): as its box of the checkpoint tensor (`box_view`, what a sliced receiver stages
against and writes through), or in walk order (`walk_view`).

`rows` slices are one contiguous range of the parameter (whole rows: fused qkv_proj /
gate_up_proj parts, column- and vocab-parallel shards), so staging reads them in place.
`cols` slices (row-parallel shards) are a column block: a strided view, read and written
in place by the CUDA backend (its walk is the block transposed). A slice of one expert of
a stacked fused-MoE parameter (`Slice.expert`) is seen the same way on that expert's
matrix, `param[expert]`."""

import torch

from weight_teleport.targets.vllm_layout import Slice


def _matrix(param: torch.Tensor, s: Slice) -> torch.Tensor:
    """What the slice lies in: `param`, or its matrix `s.expert`, after checking `param`."""
    if tuple(param.shape) != s.param_shape or not param.is_contiguous():
        raise ValueError(
            f"{s.param!r} is {tuple(param.shape)} (contiguous: {param.is_contiguous()}), "
            f"the layout expects a contiguous {s.param_shape}"
        )
    return param if s.expert is None else param[s.expert]


def box_view(param: torch.Tensor, s: Slice) -> torch.Tensor:
    """The slice's elements as its box of the checkpoint tensor (`held_box`), a view of
    `param`: rows [lo, hi) of the tensor for `rows`, its columns [lo, hi) for `cols`."""
    param = _matrix(param, s)
    n = s.hi - s.lo
    if s.order == "rows":
        return param.view(-1)[s.dest * s.inner : (s.dest + n) * s.inner].view((n,) + s.shape[1:])
    if len(s.shape) != 2:
        raise ValueError(f"{s.name!r}: a column slice of a {len(s.shape)}-D tensor; layouts cut 2-D tensors by columns")
    return param[:, s.dest : s.dest + n]


def walk_view(param: torch.Tensor, s: Slice) -> torch.Tensor:
    """The slice's elements in walk order, as a view of `param`: 1-D for `rows`, a 2-D
    strided [columns, rows] view (row-major = the walk) for `cols`."""
    param = _matrix(param, s)
    n = s.hi - s.lo
    if s.order == "rows":
        return param.view(-1)[s.dest * s.inner : (s.dest + n) * s.inner]
    return param[:, s.dest : s.dest + n].t()


def gather_walk(param: torch.Tensor, s: Slice) -> torch.Tensor:
    """The slice's elements in walk order, 1-D contiguous (a view for `rows`, a copy for `cols`)."""
    view = walk_view(param, s)
    return view if view.dim() == 1 else view.contiguous().view(-1)
