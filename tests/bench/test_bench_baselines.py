"""Peer baselines, the entropy bound, the delta simulator and the benchmark harness."""

import json
import math

import pytest
import torch

from weight_teleport.bench.baselines import BASELINES
from weight_teleport.bench.entropy import bit_view, delta_entropy, order_keys
from weight_teleport.bench.run import run_bench
from weight_teleport.bench.simulate import REAL_STEPS, UNCALIBRATED, delta_pairs, make_config, make_state

# bf16 bit patterns: +-0, +-inf, quiet and signalling NaNs with payloads, subnormals, 1.0
SPECIAL_BF16 = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFA5, 0x7F81, 0x0001, 0x8003, 0x3F80]


def _bf16(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(bit_view(a[name]), bit_view(b[name])), name


@pytest.fixture(scope="module")
def simulated() -> tuple[dict, dict]:
    master = make_state(make_config("tiny"), seed=1)
    return next(delta_pairs(master, 3e-6, 1, seed=1))


def _adversarial() -> tuple[dict, dict]:
    """Special values swapped among each other, a tensor whose changes are more than
    65535 apart, an fp32 tensor, and unchanged and fully changed tensors."""
    specials = _bf16(SPECIAL_BF16 * 3).view(3, len(SPECIAL_BF16))
    rolled = specials.view(torch.int16).roll(1, dims=1).view(torch.bfloat16)
    far_old = torch.zeros(200_000, dtype=torch.bfloat16)
    far_new = far_old.clone()
    far_new[[0, 65_535, 65_536 + 2 * 65_535, 199_999]] = _bf16([0x8000, 0x7FC1, 0x0001, 0xFF80])
    full = torch.randn(4, 33).to(torch.bfloat16)
    old = {"specials": specials, "far": far_old, "same": full.clone(), "full": full}
    new = {
        "specials": rolled,
        "far": far_new,
        "same": full.clone(),
        "full": (full.view(torch.int16) ^ 1).view(torch.bfloat16),
    }
    old["fp32"] = torch.tensor([0.0, -0.0, float("inf"), 1e-45, 3.0])
    new["fp32"] = torch.tensor([-0.0, 0.0, float("nan"), 2e-45, 3.0])
    return old, new


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: b.name)
def test_baseline_round_trips_simulated_delta(baseline, simulated):
    old, new = simulated
    _assert_same_bits(baseline.decode(old, baseline.encode(old, new)), new)


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: b.name)
def test_baseline_round_trips_adversarial_values(baseline):
    old, new = _adversarial()
    _assert_same_bits(baseline.decode(old, baseline.encode(old, new)), new)


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: b.name)
def test_baseline_round_trips_nothing_and_everything_changed(baseline, simulated):
    old, _ = simulated
    flipped = {n: (bit_view(t) ^ -1).view(t.dtype).view(t.shape) for n, t in old.items()}
    for new in (old, flipped):
        _assert_same_bits(baseline.decode(old, baseline.encode(old, new)), new)


def test_order_keys_follow_float_order():
    values = torch.tensor([-math.inf, -2.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, math.inf])
    keys = order_keys(bit_view(values.to(torch.bfloat16)))
    assert torch.all(keys[1:] - keys[:-1] > 0)
    assert int(keys[4] - keys[3]) == 1  # -0.0 and +0.0 are neighbours


def test_entropy_bound_matches_hand_computation():
    # 8 elements, 3 changed: 1.0 up one ULP (+1), -1.0 away from zero (-1), +0.0 -> -0.0 (-1)
    old = {"w": _bf16([0x3F80, 0x3F80, 0xBF80, 0x0000, 0x3F80, 0x3F80, 0x7FC1, 0x3F80])}
    new = {"w": _bf16([0x3F81, 0x3F80, 0xBF81, 0x8000, 0x3F80, 0x3F80, 0x7FC1, 0x3F80])}
    stats = delta_entropy(old, new)
    p = 3 / 8
    mask_bits = -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    residual_bits = -(1 / 3 * math.log2(1 / 3) + 2 / 3 * math.log2(2 / 3))
    assert (stats.elements, stats.changed) == (8, 3)
    assert stats.residual_bits == pytest.approx(residual_bits)
    assert stats.bound_bits_per_element == pytest.approx(mask_bits + p * residual_bits)


def test_entropy_of_identical_states_is_zero(simulated):
    old, _ = simulated
    stats = delta_entropy(old, old)
    assert stats.density == 0.0 and stats.bound_bits_per_element == 0.0


def test_simulator_is_deterministic_and_sparse_at_small_lr():
    config = make_config("tiny")
    first, second = (next(delta_pairs(make_state(config, seed=7), 1e-6, 1, seed=7)) for _ in range(2))
    _assert_same_bits(first[0], second[0])
    _assert_same_bits(first[1], second[1])
    assert 0.003 <= delta_entropy(*first).density <= 0.05


def test_run_bench_writes_json_and_plot(tmp_path):
    result = run_bench("tiny", lrs=(1e-6, 1e-5), steps=1, out_dir=tmp_path, repeats=1)
    written = json.loads((tmp_path / "bench.json").read_text())
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert written["results"] == result["results"]
    codecs = written["results"][0]["codecs"]
    assert {b.name for b in BASELINES} <= codecs.keys()
    assert codecs["raw_bf16"]["bits_per_element"] == pytest.approx(16.0, rel=1e-3)


def test_calibrated_simulator_changes_as_few_elements_as_real_steps():
    config = make_config("tiny")
    density = {}
    for cal in (UNCALIBRATED, REAL_STEPS):
        master = make_state(config, seed=7, calibration=cal)
        density[cal] = delta_entropy(*next(delta_pairs(master, 1e-6, 1, seed=7, calibration=cal))).density
    # real AdamW steps at lr 1e-6 change 0.2-0.4% of the elements (weight_teleport.bench.real)
    assert 0.001 <= density[REAL_STEPS] <= 0.006 < density[UNCALIBRATED]
