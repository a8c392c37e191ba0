"""Planning is plain Python: chunk ranges and context classes from counts."""

import numpy as np
import pytest

from weight_teleport.codec.plan import (MIN_CLASS_EVENTS, chunk_ranges, lut_to_runs, plan_classes,
                                        runs_to_lut)


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
    lut = np.array([0, 0, 2, 2, 1, 0], np.uint8)
    assert lut_to_runs(lut) == [(0, 0), (2, 2), (4, 1), (5, 0)]
    assert (runs_to_lut(lut_to_runs(lut), 6) == lut).all()
    for bad in ([], [(1, 0)], [(0, 0), (0, 1)], [(0, 99)], [(0, 0), (9, 1)]):
        with pytest.raises(ValueError):
            runs_to_lut(bad, 6)
