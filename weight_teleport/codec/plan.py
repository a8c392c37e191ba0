"""Planning, separate from moving bytes: chunk ranges, context classes, codec choice.

Takes counts and metadata, returns decisions; no torch, no kernels."""

import functools
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from weight_teleport.errors import PackFormatError
from weight_teleport.format.codecs import CODECS, DEFAULT
from weight_teleport.format.limits import MAX_CHUNK_ELEMS

DEFAULT_CHUNK_ELEMS = 1 << 22
MAX_CLASSES = 16
SPARSE_MAX_DENSITY = 0.3
"""Above this density the dense codecs are tried as well and the smallest output kept."""


def chunk_ranges(numel: int, chunk_elems: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of the chunks of a tensor."""
    return [(s, min(s + chunk_elems, numel)) for s in range(0, numel, chunk_elems)]


def check_chunk_elems(chunk_elems: int) -> None:
    if chunk_elems <= 0 or chunk_elems % 8 or chunk_elems > MAX_CHUNK_ELEMS:
        raise ValueError(f"chunk_elems must be a positive multiple of 8, at most {MAX_CHUNK_ELEMS}; got {chunk_elems}")


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


def plan_classes(total: np.ndarray, changed: np.ndarray, codec: str = DEFAULT) -> ClassPlan:
    """Group context keys whose change rates are alike into classes.

    Keys that never changed form a class of their own (it costs nothing to code). The keys
    that changed, in order of falling change rate, are cut into at most MAX_CLASSES runs
    (one class each) that minimise the estimated size: per class the entropy of its change
    mask, T * H(C / T) bits for T elements of which C changed (what its gap coding comes
    close to), plus the class cost of `codec` (`class_cost`) in each of the tensor's chunks of DEFAULT_CHUNK_ELEMS
    (an estimate when a pack's chunks differ: every plan decodes, this one is smaller)."""
    return plan_table(total[None], changed[None], codec)[0]


def class_cost(codec: str) -> float:
    """What a context class is taken to cost in every chunk of a record of the sparse codec
    `codec`, beyond its events' entropy (its line in format/codecs.py says why): the planner
    splits keys into another class only where the split saves more."""
    return CODECS[codec].class_cost_bits


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
        return ClassPlan(self.lut[i], self.inverted[i, : self.n_classes[i]], int(self.events[i]))

    def take(self, rows) -> "PlanTable":
        """The table of `rows` (indices) of this one."""
        return PlanTable(self.lut[rows], self.inverted[rows], self.n_classes[rows], self.events[rows])


def plan_table(total: np.ndarray, changed: np.ndarray, codec: str = DEFAULT) -> PlanTable:
    """`plan_classes` of every row of [tensors, keys] count tables, in one compiled walk."""
    total, changed = np.ascontiguousarray(total, np.int64), np.ascontiguousarray(changed, np.int64)
    if (changed < 0).any() or (changed > total).any():
        raise ValueError("changed counts must lie between 0 and the element counts")
    plans = PlanTable(
        np.zeros(total.shape, np.uint8),
        np.zeros((total.shape[0], MAX_CLASSES), np.bool_),
        np.zeros(total.shape[0], np.int64),
        np.zeros(total.shape[0], np.int64),
    )
    _plan_rows(
        total, changed, class_cost(codec), DEFAULT_CHUNK_ELEMS, plans.lut, plans.inverted, plans.n_classes, plans.events
    )
    return plans


@njit(nogil=True, cache=True)
def _mask_bits(c: float, t: float) -> float:
    """t * H(c / t): bits of a change mask of t elements of which c changed."""
    if c <= 0 or c >= t:
        return 0.0
    return -(c * np.log2(c / t) + (t - c) * np.log2((t - c) / t))


@njit(nogil=True, cache=True)
def _cut(t_cum, c_cum, n, k_max, class_bits):
    """Optimal cut of n sorted keys (prefix sums t_cum, c_cum) into at most k_max runs:
    the runs' ends in order."""
    cost = np.empty((n + 1, n + 1), np.float64)
    for i in range(n):
        for j in range(i + 1, n + 1):
            cost[i, j] = _mask_bits(c_cum[j] - c_cum[i], t_cum[j] - t_cum[i]) + class_bits
    best = np.full((k_max + 1, n + 1), np.inf)
    arg = np.zeros((k_max + 1, n + 1), np.int64)
    best[0, 0] = 0.0
    for k in range(1, k_max + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                v = best[k - 1, i] + cost[i, j]
                if v < best[k, j]:
                    best[k, j], arg[k, j] = v, i
    k = 1
    for kk in range(2, k_max + 1):
        if best[kk, n] < best[k, n]:
            k = kk
    ends = np.empty(k, np.int64)
    j = n
    for r in range(k - 1, -1, -1):
        ends[r] = j
        j = arg[r + 1, j]
    return ends


@njit(nogil=True, cache=True)
def _plan_rows(total, changed, class_bits, chunk_elems, lut, inverted, n_classes, events) -> None:
    """Fills lut, inverted, n_classes and events of every row (see plan_classes)."""
    rows, keys = total.shape
    for r in range(rows):
        still = 0
        moving = np.empty(keys, np.int64)
        n = 0
        for k in range(keys):
            if total[r, k] > 0 and changed[r, k] > 0:
                moving[n] = k
                n += 1
            elif total[r, k] > 0:
                still = 1
        n_classes[r], events[r] = 1, 0
        if n == 0:
            continue
        moving = moving[:n]
        rate = np.empty(n, np.float64)
        for i in range(n):
            rate[i] = -changed[r, moving[i]] / total[r, moving[i]]
        moving = moving[np.argsort(rate, kind="mergesort")]
        t_cum = np.zeros(n + 1, np.float64)
        c_cum = np.zeros(n + 1, np.float64)
        for i in range(n):
            t_cum[i + 1] = t_cum[i] + total[r, moving[i]]
            c_cum[i + 1] = c_cum[i] + changed[r, moving[i]]
        chunks = (total[r].sum() + chunk_elems - 1) // chunk_elems
        ends = _cut(t_cum, c_cum, n, MAX_CLASSES - still, class_bits * chunks)
        start, ev = 0, 0
        for c in range(ends.size):
            cls = c + still
            t_sum, c_sum = 0, 0
            for i in range(start, ends[c]):
                lut[r, moving[i]] = cls
                t_sum += total[r, moving[i]]
                c_sum += changed[r, moving[i]]
            inverted[r, cls] = 2 * c_sum > t_sum
            ev += t_sum - c_sum if inverted[r, cls] else c_sum
            start = ends[c]
        n_classes[r], events[r] = ends.size + still, ev


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
        flat = np.fromiter(
            itertools.chain.from_iterable(itertools.chain.from_iterable(runs)), np.int64, 2 * int(first[-1])
        )
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


def class_maps(recs: list, info, runs: Runs | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """([records, keys] uint8 class maps, [records, MAX_CLASSES] inverted flags, classes per
    record) of sparse records (`format.TensorRecord`s) of one element type (a
    `dtypes.DtypeInfo`), in one compiled walk; PackFormatError naming the first bad record.
    `runs`: `run_arrays` of the records' maps, made already."""
    try:
        luts = runs_to_luts([rec.classes for rec in recs], 1 << info.exponent_bits, runs)
    except ClassMapError as e:
        raise PackFormatError(f"tensor {recs[e.index].name!r}: {e}") from None
    n_classes = luts.max(1).astype(np.int64) + 1 if len(recs) else np.zeros(0, np.int64)
    inverted = np.zeros((len(recs), MAX_CLASSES), np.bool_)
    for i, rec in enumerate(recs):
        for c in rec.inverted:
            if not 0 <= c < n_classes[i]:
                raise PackFormatError(f"tensor {rec.name!r}: inverted class {c} does not exist")
            inverted[i, c] = True
    return luts, inverted, n_classes


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
            luts[r, starts[i] : stop] = classes[i]
    return -1, -1
