"""Which box of each checkpoint tensor a trainer rank holds: from DTensors (FSDP2's
`fully_shard`, tensor parallelism over a DeviceMesh) or from plain local tensors with a
slice each. No communication: each rank reads its own placements."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weight_teleport.codec import TensorSlice


def local_shards(
    state: Mapping[str, torch.Tensor], slices: Mapping[str, TensorSlice] | None = None
) -> tuple[dict, dict]:
    """(local tensors, slices) of the tensors this rank publishes.

    A DTensor gives its local shard and the box it covers; one replicated over some mesh
    dimension is published by the ranks at coordinate 0 of that dimension alone (so that
    each element is published once). A plain tensor is published as it is: the box
    `slices[name]` of its checkpoint tensor, or the whole tensor where `slices` does not
    name it (a tensor one rank alone holds)."""
    slices = dict(slices or {})
    tensors, boxes = {}, {}
    for name, t in state.items():
        if _is_dtensor(t):
            found = _dtensor_box(t)
            if found is None:
                continue
            t, boxes[name] = found
        elif name in slices:
            boxes[name] = slices[name]
        tensors[name] = t.detach()
    unknown = sorted(set(slices) - set(state))
    if unknown:
        raise ValueError(f"slices name tensors the state does not hold, e.g. {unknown[:5]}")
    return tensors, boxes


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(t, DTensor)


def _dtensor_box(t) -> tuple[torch.Tensor, TensorSlice] | None:
    """(local tensor, its box) of a DTensor sharded by Shard placements; None where another
    rank publishes these elements (a replicated placement, this rank not at coordinate 0)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = t.device_mesh
    coords = mesh.get_coordinate()
    if coords is None:  # this rank is outside the mesh
        return None
    for k, p in enumerate(t.placements):
        if isinstance(p, Replicate):
            if coords[k] != 0:
                return None
        elif not isinstance(p, Shard):
            raise ValueError(f"a DTensor placement {p} (partial sums) cannot be published: reduce it first")
    shape, offset = compute_local_shape_and_global_offset(t.shape, mesh, t.placements)
    local = t.to_local()
    if tuple(local.shape) != tuple(shape):
        raise ValueError(f"a DTensor's local shard is {tuple(local.shape)}, its placements say {tuple(shape)}")
    return local, TensorSlice(tuple(t.shape), tuple(zip(offset, shape)))
