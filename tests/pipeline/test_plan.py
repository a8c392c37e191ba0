"""Planning is plain Python: chunk ranges and context classes from counts."""

import math
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_teleport.codec import plan as P
from weight_teleport.codec.plan import (
    MAX_CLASSES,
    ClassMapError,
    chunk_ranges,
    lut_to_runs,
    plan_classes,
    plan_table,
    run_arrays,
    runs_to_luts,
)


def test_chunk_ranges_cover_the_tensor():
    assert chunk_ranges(20, 8) == [(0, 8), (8, 16), (16, 20)]
    assert chunk_ranges(0, 8) == []


def test_classes_follow_change_rates():
    total = np.zeros(256, np.int64)
    changed = np.zeros(256, np.int64)
    total[100:110] = 100_000
    changed[100:110] = [60_000, 30_000, 10_000, 5_000, 2_500, 1_200, 600, 0, 0, 0]
    plan = plan_classes(total, changed)
    lut = plan.lut
    assert lut[107] == lut[108] == lut[109]  # never changed: one free class
    assert len({int(lut[k]) for k in range(100, 105)}) == 5  # rates far apart: classes apart
    assert lut[105] == lut[106]  # 1.2% and 0.6%: a split saves less than a class costs
    assert plan.inverted[lut[100]] and not plan.inverted[lut[101]]


def test_small_classes_are_merged():
    """A class costs `class_cost("sparse")`: keys of alike rates and few changes share one."""
    total = np.full(256, 1000, np.int64)
    changed = np.zeros(256, np.int64)
    changed[:40] = np.arange(1, 41)
    plan = plan_classes(total, changed)
    assert 2 <= plan.n_classes <= 6


def test_runs_round_trip_and_validation():
    """Class maps go to runs and back (the runs made independently, by lut_to_runs); for a list
    holding a malformed map, the first bad one's index and what is wrong with it."""
    lut = np.array([0, 0, 2, 2, 1, 0], np.uint8)
    assert lut_to_runs(lut) == [(0, 0), (2, 2), (4, 1), (5, 0)]
    rng = np.random.default_rng(0)
    luts = (
        [lut]
        + [np.sort(rng.integers(0, 16, 6)).astype(np.uint8) for _ in range(30)]
        + [rng.integers(0, 16, 6).astype(np.uint8) for _ in range(30)]
    )
    assert (runs_to_luts([lut_to_runs(x) for x in luts], 6) == np.stack(luts)).all()
    assert runs_to_luts([], 6).shape == (0, 6)
    for bad, message in (
        ([], "must start at key 0"),
        ([(1, 0)], "must start at key 0"),
        ([(0, 0), (0, 1)], r"run \(0, 0\)"),
        ([(0, 99)], r"run \(0, 99\)"),
        ([(0, 0), (9, 1)], r"run \(0, 0\)"),
        ([(0, -1)], r"run \(0, -1\)"),
        ([(0, 0), (3, 10**30)], r"run \(3, 1000000000000000000000000000000\)"),
    ):
        with pytest.raises(ClassMapError, match=message) as e:
            runs_to_luts([[(0, 1)], [(0, 0), (3, 2)], bad, [(1, 0)]], 6)
        assert e.value.index == 2 and isinstance(e.value, ValueError)


def _mask_bits(c: int, t: int) -> float:
    return 0.0 if c in (0, t) else -(c * math.log2(c / t) + (t - c) * math.log2((t - c) / t))


def _partitions(items):
    """Every partition of `items` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1 :]
        yield [[first]] + part


def _estimate(total, changed, groups) -> float:
    chunks = -(-int(total.sum()) // P.DEFAULT_CHUNK_ELEMS)
    return sum(_mask_bits(int(changed[g].sum()), int(total[g].sum())) + P.class_cost("sparse") * chunks for g in groups)


@st.composite
def _small_counts(draw):
    """Up to 7 keys that changed (every way to group them is tried) and some that did not."""
    n = draw(st.integers(1, 7))
    total = np.array(draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n)), np.int64)
    frac = draw(st.lists(st.sampled_from([1.0, 0.9, 0.5, 0.3, 0.05, 1e-2, 1e-3, 1e-4]), min_size=n, max_size=n))
    changed = np.maximum(1, np.round(total * np.array(frac))).astype(np.int64)
    still = draw(st.integers(0, 3))
    return np.concatenate([total, np.full(still, 50, np.int64), [0]]), np.concatenate([changed, [0] * (still + 1)])


@settings(max_examples=150, deadline=None)
@given(_small_counts())
def test_plans_are_the_cheapest_grouping(counts):
    """Over every grouping of the keys that changed, none has a smaller estimated size; keys
    that never changed share a class of their own, inversion follows the majority."""
    total, changed = counts
    plan = plan_classes(total, changed)
    moving = [k for k in range(total.size) if changed[k]]
    groups = [[k for k in moving if plan.lut[k] == c] for c in range(plan.n_classes)]
    groups = [g for g in groups if g]
    best = min(_estimate(total, changed, g) for g in _partitions(moving))
    assert _estimate(total, changed, groups) <= best * (1 + 1e-12) + 1e-9
    still = [k for k in range(total.size) if total[k] and not changed[k]]
    assert len({int(plan.lut[k]) for k in still}) <= 1 and not set(plan.lut[still]) & set(plan.lut[moving])
    for c in range(plan.n_classes):
        members = (plan.lut == c) & (total > 0)
        assert plan.inverted[c] == (2 * changed[members].sum() > total[members].sum())


def test_a_plan_table_holds_the_single_plans():
    """One walk over many rows plans each as alone (no scratch state leaks from row to row),
    and the rows a table takes are the same plans."""
    rng = np.random.default_rng(3)
    total = rng.integers(0, 10**7, (50, 256))
    changed = (total * rng.random((50, 256)) ** rng.choice([3, 4], (50, 1))).astype(np.int64)
    changed[::7] = 0  # unchanged tensors: one class, no events
    table = plan_table(total, changed)
    rows = np.array([3, 0, 21, 49])
    part = table.take(rows)
    for i in range(len(table)):
        ref = plan_classes(total[i], changed[i])
        for got in [table[i]] + [part[k] for k in np.flatnonzero(rows == i)]:
            assert (got.lut == ref.lut).all() and (got.inverted == ref.inverted).all() and got.events == ref.events
    assert table.n_classes[0] == 1 and table.events[0] == 0
    assert not table.inverted[
        np.arange(MAX_CLASSES)[None, :] >= table.n_classes[:, None]
    ].any()  # False past the classes


def test_counts_are_checked():
    with pytest.raises(ValueError):
        plan_table(np.array([[5]]), np.array([[6]]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(-3, 9), st.one_of(st.integers(-3, 20), st.just(10**30))), max_size=4), max_size=6
    )
)
def test_run_arrays_give_the_runs_and_their_top_classes(runs):
    """The runs as arrays (numbers past int64 as -1) and each list's largest class clipped
    into [0, MAX_CLASSES), 0 for an empty list, as the stage's walk takes them; for the maps
    runs_to_luts accepts, those classes are the maps' own (the stage's walk starts on them
    and asserts them against the class maps once those are made)."""
    arrays = run_arrays(runs)
    flat = [(a, c if c < 1 << 62 else -1) for r in runs for a, c in r]
    assert arrays.first.tolist() == np.cumsum([0] + [len(r) for r in runs]).tolist()
    assert arrays.starts.tolist() == [a for a, _ in flat] and arrays.classes.tolist() == [c for _, c in flat]
    want = [min(max(max((c if c < 1 << 62 else -1 for _, c in r), default=0), 0), MAX_CLASSES - 1) for r in runs]
    assert arrays.top_classes().tolist() == want
    try:
        luts = runs_to_luts(runs, 10, arrays)
    except ClassMapError:
        return
    assert arrays.top_classes().tolist() == luts.max(1, initial=0).tolist()
