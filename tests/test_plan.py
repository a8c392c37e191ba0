"""Planning is plain Python: chunk ranges and context classes from counts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_teleport.codec.plan import (MAX_CLASSES, MIN_CLASS_EVENTS, ClassMapError, band, chunk_ranges, lut_to_runs,
                                        plan_classes, plan_table, run_arrays, runs_to_luts)


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
    assert lut[107] == lut[108] == lut[109]          # never changed: one free class
    assert len({int(lut[k]) for k in range(100, 107)}) == 7
    assert plan.inverted[lut[100]] and not plan.inverted[lut[101]]


def test_small_classes_are_merged():
    total = np.full(256, 1000, np.int64)
    changed = np.zeros(256, np.int64)
    changed[:40] = np.arange(1, 41)
    plan = plan_classes(total, changed)
    for c in range(plan.n_classes):
        events = changed[plan.lut == c].sum()
        assert events == 0 or events >= MIN_CLASS_EVENTS or c == plan.n_classes - 1


def test_runs_round_trip_and_validation():
    """Class maps go to runs and back (the runs made independently, by lut_to_runs); for a list
    holding a malformed map, the first bad one's index and what is wrong with it."""
    lut = np.array([0, 0, 2, 2, 1, 0], np.uint8)
    assert lut_to_runs(lut) == [(0, 0), (2, 2), (4, 1), (5, 0)]
    rng = np.random.default_rng(0)
    luts = [lut] + [np.sort(rng.integers(0, 16, 6)).astype(np.uint8) for _ in range(30)] + \
        [rng.integers(0, 16, 6).astype(np.uint8) for _ in range(30)]
    assert (runs_to_luts([lut_to_runs(x) for x in luts], 6) == np.stack(luts)).all()
    assert runs_to_luts([], 6).shape == (0, 6)
    for bad, message in (([], "must start at key 0"), ([(1, 0)], "must start at key 0"),
                         ([(0, 0), (0, 1)], r"run \(0, 0\)"), ([(0, 99)], r"run \(0, 99\)"),
                         ([(0, 0), (9, 1)], r"run \(0, 0\)"), ([(0, -1)], r"run \(0, -1\)"),
                         ([(0, 0), (3, 10 ** 30)], r"run \(3, 1000000000000000000000000000000\)")):
        with pytest.raises(ClassMapError, match=message) as e:
            runs_to_luts([[(0, 1)], [(0, 0), (3, 2)], bad, [(1, 0)]], 6)
        assert e.value.index == 2 and isinstance(e.value, ValueError)


def _reference_plan(total: np.ndarray, changed: np.ndarray):
    """The planner as numpy first wrote it (float log2 bands), to hold the compiled one to."""
    keys = np.flatnonzero(total)
    rate = changed[keys] / total[keys]
    band_ = np.full(keys.size, -1, np.int64)
    moving = rate > 0
    band_[moving] = np.floor(-np.log2(rate[moving]) * 2).astype(np.int64)
    groups = []
    still = np.flatnonzero(band_ < 0)
    if still.size:
        groups.append(still)
    mv = np.flatnonzero(band_ >= 0)
    order = mv[np.argsort(band_[mv], kind="stable")]
    runs = np.flatnonzero(np.diff(band_[order], prepend=-1)) if order.size else np.zeros(0, np.int64)
    run_events = np.add.reduceat(changed[keys][order], runs).tolist() if order.size else []
    first, count = 0, 0
    for stop, n in zip(runs[1:].tolist() + [order.size], run_events):
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
    groups = groups or [np.zeros(0, np.int64)]
    cls = np.zeros(keys.size, np.int64)
    for c, members in enumerate(groups):
        cls[members] = c
    lut = np.zeros(total.size, np.uint8)
    lut[keys] = cls
    n_changed = np.bincount(cls, weights=changed[keys], minlength=len(groups))
    n_total = np.bincount(cls, weights=total[keys], minlength=len(groups))
    inverted = n_changed * 2 > n_total
    events = int(np.where(inverted, n_total - n_changed, n_changed).sum())
    return lut, inverted, events


@st.composite
def _counts(draw):
    keys = draw(st.sampled_from([2, 16, 256]))
    scale = draw(st.sampled_from([10, 1000, 10 ** 6, 10 ** 9]))
    total = np.array(draw(st.lists(st.integers(0, scale), min_size=keys, max_size=keys)), np.int64)
    total[np.array(draw(st.lists(st.booleans(), min_size=keys, max_size=keys)))] = 0
    frac = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, 1e-3, 1e-6, 0.3, 0.7071]), min_size=keys,
                                  max_size=keys)))
    return total, np.minimum(total, np.round(total * frac).astype(np.int64))


@settings(max_examples=400, deadline=None)
@given(_counts())
def test_compiled_plans_match_the_reference(counts):
    total, changed = counts
    lut, inverted, events = _reference_plan(total, changed)
    plan = plan_classes(total, changed)
    assert (plan.lut == lut).all() and (plan.inverted == inverted).all() and plan.events == events
    assert plan.runs == lut_to_runs(lut)


def test_a_plan_table_holds_the_single_plans():
    """One walk over many rows plans each as alone (no scratch state leaks from row to row),
    and the rows a table takes are the same plans."""
    rng = np.random.default_rng(3)
    total = rng.integers(0, 10 ** 7, (50, 256))
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
    assert not table.inverted[np.arange(MAX_CLASSES)[None, :] >= table.n_classes[:, None]].any()  # False past the classes


def test_bands_are_exact_where_floats_round():
    # (t / c)**2 just above and just below powers of two: 99**2 - 2 * 70**2 = 1, and Pell
    # pairs far past float precision; the band is floor(2 log2(t / c)) in exact arithmetic
    pairs = [(99, 70), (665857, 470832), (4478554083, 3166815962), (3, 3), (1, 1), (2, 1), (7, 5),
             (2 ** 62, 1), (2 ** 62 - 1, 3), (10 ** 18, 10 ** 18 - 1)]
    for t, c in pairs:
        exact = max(b for b in range(130) if c * c * 2 ** b <= t * t)
        assert band(t, c) == exact, (t, c)
    with pytest.raises(ValueError):
        plan_table(np.array([[5]]), np.array([[6]]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-3, 9), st.one_of(st.integers(-3, 20), st.just(10 ** 30))),
                         max_size=4), max_size=6))
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
