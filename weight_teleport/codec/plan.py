"""Planning, separate from moving bytes: chunk ranges, context classes, codec choice.

Takes counts and metadata, returns decisions; no torch, no kernels."""

from dataclasses import dataclass

import numpy as np

DEFAULT_CHUNK_ELEMS = 1 << 22
MAX_CHUNK_ELEMS = 1 << 22
"""Gaps inside a chunk must fit the event symbol's 45 buckets (docs/FORMAT.md)."""
MAX_CLASSES = 16
MIN_CLASS_EVENTS = 512
"""A context class must hold at least this many events (changes) in the tensor: smaller
classes do not pay for their streams' own overhead and are merged with a neighbour."""
BANDS_PER_OCTAVE = 2
SPARSE_MAX_DENSITY = 0.3
"""Above this density the dense codecs are tried as well and the smallest output kept."""


def chunk_ranges(numel: int, chunk_elems: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of the chunks of a tensor."""
    return [(s, min(s + chunk_elems, numel)) for s in range(0, numel, chunk_elems)]


def check_chunk_elems(chunk_elems: int) -> None:
    if chunk_elems <= 0 or chunk_elems % 8 or chunk_elems > MAX_CHUNK_ELEMS:
        raise ValueError(f"chunk_elems must be a positive multiple of 8, at most {MAX_CHUNK_ELEMS}; "
                         f"got {chunk_elems}")


@dataclass
class ClassPlan:
    lut: np.ndarray
    """uint8 class of every context key."""
    runs: list[tuple[int, int]]
    """The same map as (first key, class) runs, as stored in the pack."""
    inverted: np.ndarray
    """bool per class: code the unchanged elements of this class instead of the changed ones."""

    @property
    def n_classes(self) -> int:
        return len(self.inverted)


def plan_classes(total: np.ndarray, changed: np.ndarray) -> ClassPlan:
    """Group context keys whose change rates are alike into classes.

    Keys are banded by log2 of their change rate (half-octave bands); keys that never
    changed form a class of their own (it costs nothing to code); adjacent bands are merged
    until each class holds MIN_CLASS_EVENTS changes, at most MAX_CLASSES classes."""
    keys = np.flatnonzero(total)
    rate = changed[keys] / total[keys]
    band = np.full(keys.size, -1, np.int64)
    moving = rate > 0
    band[moving] = np.floor(-np.log2(rate[moving]) * BANDS_PER_OCTAVE).astype(np.int64)
    groups = _merge_bands(band, changed[keys])
    cls = np.zeros(keys.size, np.int64)
    for c, members in enumerate(groups):
        cls[members] = c
    lut = np.zeros(total.size, np.uint8)
    lut[keys] = cls
    n_changed = np.bincount(cls, weights=changed[keys], minlength=len(groups))
    n_total = np.bincount(cls, weights=total[keys], minlength=len(groups))
    return ClassPlan(lut, lut_to_runs(lut), n_changed * 2 > n_total)


def _merge_bands(band: np.ndarray, events: np.ndarray) -> list[np.ndarray]:
    """Index groups of keys: one per merged run of adjacent bands, the still keys first.
    Moving keys are ordered by band (keys ascending within one), so every group is a slice
    of that order and the walk over bands needs no array operation per band."""
    groups = []
    still = np.flatnonzero(band < 0)
    if still.size:
        groups.append(still)
    moving = np.flatnonzero(band >= 0)
    order = moving[np.argsort(band[moving], kind="stable")]
    runs = np.flatnonzero(np.diff(band[order], prepend=-1)) if order.size else np.zeros(0, np.int64)
    run_events = np.add.reduceat(events[order], runs).tolist() if order.size else []
    ends = runs[1:].tolist() + [order.size]
    first, count = 0, 0
    for stop, n in zip(ends, run_events):
        count += int(n)
        if count >= MIN_CLASS_EVENTS:
            groups.append(order[first:stop])
            first, count = stop, 0
    if first < order.size:
        if len(groups) > (1 if still.size else 0):
            groups[-1] = np.concatenate([groups[-1], order[first:]])
        else:
            groups.append(order[first:])
    while len(groups) > MAX_CLASSES:
        groups[-2] = np.concatenate([groups[-2], groups.pop()])
    return groups or [np.zeros(0, np.int64)]


def lut_to_runs(lut: np.ndarray) -> list[tuple[int, int]]:
    starts = np.flatnonzero(np.diff(lut.astype(np.int64), prepend=-1))
    return [(int(k), int(lut[k])) for k in starts]


def runs_to_lut(runs: list[tuple[int, int]], n_keys: int) -> np.ndarray:
    """The class of every key from (first key, class) runs; ValueError if malformed."""
    if not runs or runs[0][0] != 0:
        raise ValueError("class map must start at key 0")
    lut = np.empty(n_keys, np.uint8)
    bounds = [k for k, _ in runs] + [n_keys]
    for (start, cls), stop in zip(runs, bounds[1:]):
        if not (0 <= start < stop <= n_keys) or not (0 <= cls < MAX_CLASSES):
            raise ValueError(f"malformed class map run ({start}, {cls})")
        lut[start:stop] = cls
    return lut

