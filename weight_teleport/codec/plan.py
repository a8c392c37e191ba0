"""Planning, separate from moving bytes: chunk ranges, context classes, codec choice.

Takes counts and metadata, returns decisions; no torch, no kernels."""

import functools
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from weight_teleport.format.limits import MAX_CHUNK_ELEMS

DEFAULT_CHUNK_ELEMS = 1 << 22
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
    inverted: np.ndarray
    """bool per class: code the unchanged elements of this class instead of the changed ones."""
    events: int = 0
    """Elements the classes code: the changed ones, the unchanged ones of inverted classes."""

    @property
    def n_classes(self) -> int:
        return len(self.inverted)

    @functools.cached_property
    def runs(self) -> list[tuple[int, int]]:
        """The class map as (first key, class) runs, as stored in the pack: made when first
        asked for (the CUDA encoder asks while its events kernel runs, not on the path to
        its launch)."""
        return lut_to_runs(self.lut)


def plan_classes(total: np.ndarray, changed: np.ndarray) -> ClassPlan:
    """Group context keys whose change rates are alike into classes.

    Keys are banded by log2 of their change rate (half-octave bands); keys that never
    changed form a class of their own (it costs nothing to code); adjacent bands are merged
    until each class holds MIN_CLASS_EVENTS changes, at most MAX_CLASSES classes."""
    return plan_table(total[None], changed[None])[0]


@dataclass
class PlanTable:
    """`plan_classes` of many tensors as arrays, row i tensor i's (`plan_table`)."""
    lut: np.ndarray
    """[tensors, keys] uint8 class of every context key."""
    inverted: np.ndarray
    """[tensors, MAX_CLASSES] bool, False past a tensor's classes."""
    n_classes: np.ndarray
    """[tensors] int64."""
    events: np.ndarray
    """[tensors] int64."""

    def __len__(self) -> int:
        return len(self.n_classes)

    def __getitem__(self, i: int) -> ClassPlan:
        return ClassPlan(self.lut[i], self.inverted[i, :self.n_classes[i]], int(self.events[i]))

    def take(self, rows) -> "PlanTable":
        """The table of `rows` (indices) of this one."""
        return PlanTable(self.lut[rows], self.inverted[rows], self.n_classes[rows], self.events[rows])


def plan_table(total: np.ndarray, changed: np.ndarray) -> PlanTable:
    """`plan_classes` of every row of [tensors, keys] count tables, in one compiled walk."""
    total, changed = np.ascontiguousarray(total, np.int64), np.ascontiguousarray(changed, np.int64)
    if (changed < 0).any() or (changed > total).any():
        raise ValueError("changed counts must lie between 0 and the element counts")
    plans = PlanTable(np.zeros(total.shape, np.uint8), np.zeros((total.shape[0], MAX_CLASSES), np.bool_),
                      np.zeros(total.shape[0], np.int64), np.zeros(total.shape[0], np.int64))
    _plan_rows(total, changed, MIN_CLASS_EVENTS, plans.lut, plans.inverted, plans.n_classes, plans.events)
    return plans


_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


@njit(nogil=True, cache=True)
def _square(a):
    """(high, low) 64-bit halves of a * a for an unsigned 64-bit a."""
    lo, hi = a & _LOW, a >> _32
    p0, p1, p3 = lo * lo, lo * hi, hi * hi
    mid = (p0 >> _32) + (p1 & _LOW) + (p1 & _LOW)
    return p3 + (p1 >> _32) + (p1 >> _32) + (mid >> _32), (p0 & _LOW) | (mid << _32)


@njit(nogil=True, cache=True)
def band(total: int, changed: int) -> int:
    """floor(BANDS_PER_OCTAVE * log2(total / changed)) for 0 < changed <= total, in exact
    integers: the largest b with changed**2 * 2**b <= total**2."""
    t, c = np.uint64(total), np.uint64(changed)
    b = 0
    while (c << np.uint64(b + 1)) <= t:
        b += 1
    th, tl = _square(t)
    mh, ml = _square(c << np.uint64(b))
    mh, ml = (mh << np.uint64(1)) | (ml >> np.uint64(63)), ml << np.uint64(1)
    return 2 * b + (1 if th > mh or (th == mh and tl >= ml) else 0)


_BANDS = 2 * 64 + 2
"""More than the largest band of 64-bit counts."""


@njit(nogil=True, cache=True)
def _plan_rows(total, changed, min_events, lut, inverted, n_classes, events) -> None:
    """Fills lut, inverted, n_classes and events of every row (see plan_classes), in
    O(keys + bands) a row: keys in (band, key) order are walked as bands."""
    rows, keys = total.shape
    band_of = np.empty(keys, np.int64)
    band_keys = np.empty(_BANDS, np.int64)
    band_changed = np.empty(_BANDS, np.int64)
    group = np.empty(_BANDS, np.int64)
    for r in range(rows):
        top, still = 0, 0
        band_keys[:] = 0
        band_changed[:] = 0
        for k in range(keys):
            band_of[k] = -1
            if total[r, k] > 0 and changed[r, k] > 0:
                b = band(total[r, k], changed[r, k])
                band_of[k] = b
                band_keys[b] += 1
                band_changed[b] += changed[r, k]
                top = max(top, b + 1)
            elif total[r, k] > 0:
                still = 1
        # moving keys in (band, key) order, bands merged until a group holds enough events
        g, count, open_keys = still, 0, 0
        for b in range(top):
            group[b] = g
            count += band_changed[b]
            open_keys += band_keys[b]
            if band_keys[b] and count >= min_events:
                g, count, open_keys = g + 1, 0, 0
        if open_keys and g > still:  # the last keys join the last group
            for b in range(top):
                if group[b] == g:
                    group[b] = g - 1
        elif open_keys:
            g += 1
        n = min(max(g, 1), MAX_CLASSES)
        t_sum = np.zeros(MAX_CLASSES, np.int64)
        c_sum = np.zeros(MAX_CLASSES, np.int64)
        for k in range(keys):
            if total[r, k] > 0:
                c = 0 if band_of[k] < 0 else min(group[band_of[k]], MAX_CLASSES - 1)
                lut[r, k] = c
                t_sum[c] += total[r, k]
                c_sum[c] += changed[r, k]
        ev = 0
        for c in range(n):
            inverted[r, c] = 2 * c_sum[c] > t_sum[c]
            ev += t_sum[c] - c_sum[c] if inverted[r, c] else c_sum[c]
        n_classes[r], events[r] = n, ev


def lut_to_runs(lut: np.ndarray) -> list[tuple[int, int]]:
    """(first key, class) runs of a class map."""
    starts = np.flatnonzero(lut[1:] != lut[:-1]) + 1
    starts = np.concatenate(([0], starts))
    return list(zip(starts.tolist(), lut[starts].tolist()))


class ClassMapError(ValueError):
    """A malformed class map among several: `index` is the first bad one."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


class Runs(NamedTuple):
    """The (first key, class) runs of several class maps as arrays (`run_arrays`)."""
    first: np.ndarray
    """[maps + 1]: where each map's runs start."""
    starts: np.ndarray
    """Each run's first key."""
    classes: np.ndarray
    """Each run's class."""

    def top_classes(self) -> np.ndarray:
        """Each map's largest class clipped into [0, MAX_CLASSES) (0 without runs): a valid
        map's number of classes less one."""
        top = np.zeros(self.first.size - 1, np.int64)
        some = self.first[1:] > self.first[:-1]
        if some.any():
            top[some] = np.maximum.reduceat(np.clip(self.classes, 0, MAX_CLASSES - 1), self.first[:-1][some])
        return top


def run_arrays(runs: list[list[tuple[int, int]]]) -> Runs:
    """The run lists `runs` as Runs (a number past int64, which no valid map holds, as -1)."""
    first = np.zeros(len(runs) + 1, np.int64)
    np.cumsum([len(r) for r in runs], out=first[1:])
    try:
        flat = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(runs)), np.int64,
                           2 * int(first[-1]))
    except OverflowError:
        flat = np.array([x if -(1 << 62) < x < 1 << 62 else -1 for r in runs for run in r for x in run], np.int64)
    flat = flat.reshape(-1, 2)
    return Runs(first, flat[:, 0].copy(), flat[:, 1].copy())


def runs_to_luts(runs: list[list[tuple[int, int]]], n_keys: int, arrays: Runs | None = None) -> np.ndarray:
    """[len(runs), n_keys] uint8: the class of every key of each (first key, class) run list,
    filled by one compiled walk; ClassMapError for the first malformed list (one that does
    not start at key 0, a run that does not start after the previous one or ends past the
    keys, or a class outside [0, MAX_CLASSES)). `arrays`: `run_arrays(runs)`, made already."""
    arrays = arrays or run_arrays(runs)
    luts = np.empty((len(runs), n_keys), np.uint8)
    row, run = _fill_luts(arrays.starts, arrays.classes, arrays.first, n_keys, MAX_CLASSES, luts)
    if row >= 0:
        if run < 0:
            raise ClassMapError(row, "class map must start at key 0")
        start, cls = runs[row][run]
        raise ClassMapError(row, f"malformed class map run ({start}, {cls})")
    return luts


@njit(nogil=True, cache=True)
def _fill_luts(starts, classes, first, n_keys, max_classes, luts) -> tuple[int, int]:
    """Fills row r of luts from runs first[r]..first[r + 1] - 1; (the first malformed row, its
    bad run or -1 when it does not start at key 0), or (-1, -1)."""
    for r in range(first.size - 1):
        a, b = first[r], first[r + 1]
        if b == a or starts[a] != 0:
            return r, -1
        for i in range(a, b):
            stop = starts[i + 1] if i + 1 < b else n_keys
            if not (0 <= starts[i] < stop <= n_keys) or not (0 <= classes[i] < max_classes):
                return r, i - a
            luts[r, starts[i]:stop] = classes[i]
    return -1, -1

