"""Boxes of checkpoint tensors and the walks over them (docs/FORMAT.md, "Records over boxes").

A box is a tuple of (offset, extent) per dimension, in checkpoint coordinates. A record's
walk numbers its box's elements: `rows` (row-major) or `cols` (column-major over the box's
2-D view [e0, e1*e2*...]). Plain geometry, the torch views that put a tensor's elements
in walk order without copying them, and staged chunks of walks put back in whole tensors'
row-major order (`flat_chunk`, `flat_walks`)."""

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec.patch import ChunkPatch, StagedPatch

Box = tuple[tuple[int, int], ...]
ORDERS = ("rows", "cols")


@dataclass(frozen=True)
class TensorSlice:
    """What a local tensor is: the box `box` of a checkpoint tensor of shape `shape`."""

    shape: tuple[int, ...]
    """Shape of the whole checkpoint tensor."""
    box: Box
    """(offset, extent) per dimension; the local tensor's shape is the extents."""

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "box", tuple((int(o), int(e)) for o, e in self.box))
        if len(self.box) != len(self.shape) or any(
            o < 0 or e < 0 or o + e > d for (o, e), d in zip(self.box, self.shape)
        ):
            raise ValueError(f"box {self.box} is not inside shape {self.shape}")

    @property
    def is_whole(self) -> bool:
        return self.box == whole(self.shape)


@dataclass(frozen=True)
class Hint:
    """How a publisher walks and cuts a tensor for the receivers' slices."""

    order: str = "rows"
    """'rows' or 'cols' (receivers holding column ranges of a row-parallel tensor)."""
    bounds: tuple[int, ...] = ()
    """Where receivers' slices start or end: positions in the walk of the WHOLE checkpoint
    tensor in this order, each at a row start ('rows') or a column start of the 2-D view
    [d0, d1*d2*...] ('cols'). A record over a box is cut where the bounds fall inside it;
    the elements between two cuts are a multiple of 8 (else ValueError)."""

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"walk order {self.order!r} is not one of {ORDERS}")
        object.__setattr__(self, "bounds", tuple(int(b) for b in self.bounds))


def as_hint(hint) -> Hint:
    """A `Hint` from a Hint, any object with `order` and `bounds` (the sampler layouts'
    `SliceHint`), or a pair `(order, bounds)`."""
    if isinstance(hint, Hint):
        return hint
    if hasattr(hint, "order") and hasattr(hint, "bounds"):
        return Hint(hint.order, tuple(hint.bounds))
    order, bounds = hint
    return Hint(order, tuple(bounds))


def whole(shape: Sequence[int]) -> Box:
    return tuple((0, int(d)) for d in shape)


def extents(box: Box) -> tuple[int, ...]:
    return tuple(e for _, e in box)


def numel(box: Box) -> int:
    return math.prod(extents(box))


def intersect(a: Box, b: Box) -> Box | None:
    """The box both hold, or None when they share no element."""
    out = []
    for (oa, ea), (ob, eb) in zip(a, b):
        lo, hi = max(oa, ob), min(oa + ea, ob + eb)
        if hi <= lo:
            return None
        out.append((lo, hi - lo))
    return tuple(out)


def _rowmajor_range(offsets, sizes, extents_) -> tuple[int, int] | None:
    """[start, stop) of a sub-box (offsets, sizes relative to a box of `extents_`) in the box's
    row-major numbering, or None where its elements are not one contiguous run."""
    k = 0
    while k < len(sizes) and sizes[k] == 1:
        k += 1
    if any(s != e for s, e in zip(sizes[k + 1 :], extents_[k + 1 :])):
        return None
    start, stride = 0, 1
    for o, e in zip(reversed(offsets), reversed(extents_)):
        start += o * stride
        stride *= e
    return start, start + math.prod(sizes)


def walk_range(box: Box, order: str, sub: Box) -> tuple[int, int]:
    """[start, stop) of the elements of `sub` (inside `box`) in the walk of `box`; ValueError
    where they are not one contiguous run of it (a slice the record cannot be cut for)."""
    rel = [o - bo for (o, _), (bo, _) in zip(sub, box)]
    sizes, ext = extents(sub), extents(box)
    if order == "cols" and len(box) >= 2:
        cols = _rowmajor_range(rel[1:], sizes[1:], ext[1:])
        if cols is not None and (sizes[0] == ext[0] or cols[1] - cols[0] == 1):
            return cols[0] * ext[0] + rel[0], cols[0] * ext[0] + rel[0] + math.prod(sizes)
        found = None
    else:
        found = _rowmajor_range(rel, sizes, ext)
    if found is None:
        raise ValueError(f"box {sub} is not one contiguous run of the {order} walk of box {box}")
    return found


def walk_view(tensor: torch.Tensor, held: Box, sub: Box, order: str) -> torch.Tensor:
    """A view of the elements of `sub` of `tensor` (which holds box `held`) whose row-major
    order is `sub`'s walk: for 'rows' the sub-box itself, for 'cols' its 2-D view transposed.
    ValueError where no view exists (a tensor whose strides do not allow it)."""
    view = tensor if sub == held else tensor[tuple(slice(o - ho, o - ho + e) for (o, e), (ho, _) in zip(sub, held))]
    if order != "cols" or view.dim() < 2:
        return view
    try:
        return view.view(view.shape[0], -1).T
    except RuntimeError:
        raise ValueError(
            f"a tensor of shape {tuple(tensor.shape)} and strides {tensor.stride()} has no "
            "column walk view; make it contiguous"
        ) from None


def whole_walk(tensor: torch.Tensor, order: str) -> torch.Tensor:
    """A view of a whole local tensor whose row-major order is its walk (`walk_view`)."""
    return walk_view(tensor, whole(tensor.shape), whole(tensor.shape), order)


def cut_spans(sl: TensorSlice, hint: Hint, chunk_elems: int) -> list[tuple[int, int]]:
    """[start, stop) walk ranges of the chunks of the record of `sl` walked and cut by `hint`:
    chunks of `chunk_elems` between the hint's bounds."""
    return _cut(sl, hint, chunk_elems)[0]


def cut_slices(sl: TensorSlice, hint: Hint, chunk_elems: int) -> list[int]:
    """For each chunk of `cut_spans`, the slice of the whole tensor it lies in: how many of
    the hint's bounds lie at or before its first element in the walk of the whole tensor
    (0 for every chunk of a hint without bounds). Chunks of one slice index belong to the
    same receivers across tensors cut by one layout's hints (a TP rank's slice of each)."""
    spans, before, points = _cut(sl, hint, chunk_elems)
    return [before + bisect.bisect_right(points, s) for s, _ in spans]


def _cut(sl: TensorSlice, hint: Hint, chunk_elems: int) -> tuple[list[tuple[int, int]], int, list[int]]:
    """(`cut_spans`, the hint's bounds at or before the box's first line, the cuts inside
    the record's walk)."""
    n, ext = numel(sl.box), extents(sl.box)
    if len(ext) == 0:
        ext = (1,)
    if hint.order == "cols" and len(sl.box) >= 2:
        inner = math.prod(sl.shape[2:])
        if hint.bounds and any(e != d for e, d in zip(ext[2:], sl.shape[2:])):
            raise ValueError(f"column bounds need a box covering dims 2.. whole ({sl.box} of {sl.shape})")
        first, width, step, line = sl.box[1][0] * inner, ext[1] * inner, ext[0], sl.shape[0]
    else:
        first, width, step = sl.box[0][0] if sl.box else 0, ext[0], n // max(ext[0], 1)
        line = math.prod(sl.shape[1:])
    if any(b % max(line, 1) for b in hint.bounds):
        raise ValueError(
            f"bounds {hint.bounds} of a {hint.order} walk over {sl.shape} are not all at the "
            f"start of a {'row' if hint.order == 'rows' else 'column'} ({line} elements)"
        )
    outer = [b // max(line, 1) for b in hint.bounds]
    points = sorted({(b - first) * step for b in outer if first < b < first + width})
    spans = []
    for lo, hi in zip([0, *points], [*points, n]):
        spans += [(s, min(s + chunk_elems, hi)) for s in range(lo, hi, chunk_elems)]
    if any((e - s) % 8 for s, e in spans[:-1]):
        raise ValueError(
            f"cannot cut a box {sl.box} of {sl.shape} at bounds {hint.bounds}: the chunks "
            "between them are not multiples of 8 elements"
        )
    return spans, sum(0 < b <= first for b in outer), points


def tensor_positions(box: Box, order: str, shape: Sequence[int], positions: torch.Tensor) -> torch.Tensor:
    """Positions in a record's walk over `box` as positions in the walk (same order) of the
    whole tensor of `shape` (int64)."""
    if box == whole(shape):
        return positions
    ext = extents(box)
    if order == "cols" and len(shape) >= 2:
        col, row = positions // ext[0], positions % ext[0]
        inner = _unravel(col, [(o, e) for o, e in box[1:]], shape[1:])
        return inner * shape[0] + row + box[0][0]
    return _unravel(positions, list(box), shape)


def _unravel(positions: torch.Tensor, box, shape) -> torch.Tensor:
    """Row-major positions inside `box` as row-major positions in `shape`."""
    out = torch.zeros_like(positions)
    rest = positions.clone()
    for k in range(len(shape) - 1, -1, -1):
        e = box[k][1]
        idx = rest % e if e else rest
        rest = rest // e if e else rest
        out += (idx + box[k][0]) * math.prod(shape[k + 1 :])
    return out


def flat_walks(staged: StagedPatch) -> StagedPatch:
    """`staged` (one pack) with its records walked by columns or over a box rewritten as
    flat row-major chunks of whole tensors: the contract of targets without a view
    (pipeline/target.py), which know nothing of walks. Packs cut for sliced receivers
    (`PublisherConfig.hints`) walk row-parallel tensors by columns."""
    if not staged.walks:
        return staged
    tensors = [
        t
        if t.name not in staged.walks
        else dataclasses.replace(
            t,
            chunks=[flat_chunk(c, staged.walks[t.name][1], staged.walks[t.name][2], tuple(t.shape)) for c in t.chunks],
        )
        for t in staged.tensors
    ]
    return dataclasses.replace(staged, tensors=tensors, walks={})


def flat_chunk(c: ChunkPatch, box, order: str, shape: tuple[int, ...]) -> ChunkPatch:
    """A chunk of a record over `box` (None: the whole tensor, rows) in the record's walk,
    as positions in the whole tensor's row-major order (ascending)."""
    if box is None or (order == "rows" and tuple(map(tuple, box)) == whole(shape)):
        return c
    walk = (
        torch.arange(c.values.size, dtype=torch.int64)
        if c.positions is None
        else torch.from_numpy(c.positions.astype(np.int64))
    )
    pos = tensor_positions(tuple(map(tuple, box)), order, shape, walk + c.start)
    if order == "cols" and len(shape) >= 2:
        rows = shape[0]
        pos = (pos % rows) * (math.prod(shape) // max(rows, 1)) + pos // rows
    pos, perm = torch.sort(pos)
    return ChunkPatch(0, pos.numpy(), c.values[perm.numpy()])
