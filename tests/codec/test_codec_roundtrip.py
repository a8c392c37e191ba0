"""Lossless round trips of every codec path, compared on bit patterns."""

import numpy as np
import pytest
import torch
from helpers import DTYPES, assert_bits_equal, bits, clone_state, from_bits, random_bits, specials, weight_like
from hypothesis import given, settings
from hypothesis import strategies as st

import weight_teleport as wt
from weight_teleport.codec import inspect
from weight_teleport.codec.dtypes import dtype_info


def _key_step(u: np.ndarray, dtype: torch.dtype, steps: np.ndarray) -> np.ndarray:
    """Move bit patterns by `steps` in the order-preserving integer space (wrapping)."""
    info = dtype_info(dtype)
    w = np.uint64((1 << info.bits) - 1) if info.bits < 64 else np.uint64(2**64 - 1)
    b = u.astype(np.uint64)
    if info.is_float:
        sign = np.uint64(1 << (info.bits - 1))
        key = np.where(b & sign, b ^ w, b ^ sign)
        key = (key + steps.astype(np.uint64)) & w
        b = np.where(key & sign, key ^ sign, key ^ w)
    else:
        b = (b + steps.astype(np.uint64)) & w
    if dtype == torch.bool:
        b = b & np.uint64(1)
    return b.astype(info.uint_numpy)


def make_pair(seed, dtype, shape, base, mode, change, p):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    old = (random_bits if base == "random" else weight_like)(rng, dtype, n)
    sp = np.array(specials(dtype), dtype=np.uint64).astype(old.dtype)
    if n:
        old[rng.integers(0, n, size=min(n, 4))] = rng.choice(sp, size=min(n, 4))
    mask = {
        "none": np.zeros(n, bool),
        "single": np.arange(n) == (seed % max(n, 1)),
        "density": rng.random(n) < p,
        "all": np.ones(n, bool),
    }[mode]
    new = old.copy()
    k = int(mask.sum())
    if change == "ulp":
        steps = rng.choice([1, -1, 1, -1, 2, -3, 300, -70000], size=k).astype(np.int64)
        new[mask] = _key_step(old[mask], dtype, steps.view(np.uint64))
    elif change == "random":
        new[mask] = random_bits(rng, dtype, k)
    else:
        new[mask] = rng.choice(sp, size=k)
    return from_bits(old, dtype, shape), from_bits(new, dtype, shape)


def _flipped(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 0:
        return t.clone()
    return t.view(dtype_info(t.dtype).int_torch).flip(0).view(t.dtype)


shapes = st.lists(st.integers(0, 33), min_size=0, max_size=3).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    shape=shapes,
    base=st.sampled_from(["weights", "random"]),
    mode=st.sampled_from(["none", "single", "density", "all"]),
    change=st.sampled_from(["ulp", "random", "specials"]),
    p=st.sampled_from([0.01, 0.1, 0.5, 0.9]),
    chunk=st.sampled_from([8, 24, 1 << 22]),
)
def test_delta_round_trip(seed, dtype, shape, base, mode, change, p, chunk):
    old, new = make_pair(seed, dtype, shape, base, mode, change, p)
    olds, news = {"w": old, "b": _flipped(old)}, {"w": new, "b": _flipped(new)}
    pack = wt.encode_delta(olds, news, base_version=3, version=4, chunk_elems=chunk)
    state = clone_state(olds)
    report = wt.apply_delta(state, pack, base_version=3)
    assert_bits_equal(state, news)
    assert report.version == 4 and report.digest_verified
    changed = int((bits(old).view(-1) != bits(new).view(-1)).sum())
    n = old.numel()
    assert report.elements_changed in (2 * changed, changed + n, 2 * n)  # sparse or dense per tensor


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(DTYPES), shape=shapes, chunk=st.sampled_from([8, 40, 1 << 22])
)
def test_snapshot_round_trip(seed, dtype, shape, chunk):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    t = from_bits(random_bits(rng, dtype, n), dtype, shape)
    pack = wt.encode_snapshot({"t": t}, version=7, chunk_elems=chunk)
    assert_bits_equal(wt.decode_snapshot(pack), {"t": t})
    target = {"t": torch.zeros_like(t)}
    wt.apply_delta(target, pack)
    assert_bits_equal(target, {"t": t})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["none", "single", "density", "all"])
def test_every_dtype_and_density(dtype, mode):
    old, new = make_pair(11, dtype, (37, 29), "weights", mode, "ulp", 0.01)
    state = {"x": old.clone()}
    wt.apply_delta(state, wt.encode_delta({"x": old}, {"x": new}, base_version=0, version=1, chunk_elems=256))
    assert_bits_equal(state, {"x": new})


def test_non_contiguous_inputs_and_state():
    old, new = make_pair(5, torch.bfloat16, (64, 48), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"x": old.t()}, {"x": new.t()}, base_version=0, version=1, chunk_elems=64)
    buf = old.clone()
    state = {"x": buf.t()}
    assert not state["x"].is_contiguous()
    wt.apply_delta(state, pack)
    assert_bits_equal(state, {"x": new.t()})
    assert_bits_equal({"x": buf}, {"x": new})


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "numpy"])
def test_any_bytes_like_pack_is_read(kind):
    """A pack may be any bytes-like object (a download buffer, pinned memory): same result."""
    old, new = make_pair(7, torch.bfloat16, (64, 48), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"x": old}, {"x": new}, base_version=0, version=1, chunk_elems=512)
    held = {
        "bytearray": bytearray(pack),
        "memoryview": memoryview(pack),
        "numpy": np.frombuffer(pack, np.uint8).copy(),
    }[kind]
    assert inspect(held) == inspect(pack)
    state = {"x": old.clone()}
    wt.apply_delta(state, held)
    assert_bits_equal(state, {"x": new})


def test_device_budget_leaves_cpu_patches_as_they_are():
    """`device_budget` bounds device memory; a CPU state's patch is already on the host."""
    old, new = make_pair(6, torch.bfloat16, (64, 48), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"x": old}, {"x": new}, base_version=0, version=1)
    state = {"x": old.clone()}
    staged = wt.stage_delta(state, pack, device_budget=0)
    wt.apply_staged(state, staged)
    assert_bits_equal(state, {"x": new})


def test_chain_of_versions():
    rng = np.random.default_rng(0)
    versions = [from_bits(weight_like(rng, torch.bfloat16, 5000), torch.bfloat16, (5000,))]
    for _ in range(5):
        prev = versions[-1].contiguous().view(torch.int16).numpy().view(np.uint16)
        mask = rng.random(prev.size) < 0.03
        steps = np.where(rng.random(prev.size) < 0.5, 1, -1).astype(np.int64).view(np.uint64)
        nxt = prev.copy()
        nxt[mask] = _key_step(prev[mask], torch.bfloat16, steps[mask])
        versions.append(from_bits(nxt, torch.bfloat16, (5000,)))
    packs = [
        wt.encode_delta({"w": a}, {"w": b}, base_version=i, version=i + 1)
        for i, (a, b) in enumerate(zip(versions, versions[1:]))
    ]
    state = {"w": versions[0].clone()}
    for i, pack in enumerate(packs):
        wt.apply_delta(state, pack, base_version=i)
        assert_bits_equal(state, {"w": versions[i + 1]})


def test_dense_codecs_chosen_for_heavy_changes():
    """A random rewrite and a small change of every element both leave the sparse path;
    the small change is cheapest as residuals, and both round-trip."""
    rng = np.random.default_rng(1)
    old = from_bits(weight_like(rng, torch.float32, 4096), torch.float32, (4096,))
    rewrite = from_bits(random_bits(rng, torch.float32, 4096), torch.float32, (4096,))
    nudge = old + 1e-3 * old
    for target, codecs in ((rewrite, ("dense_values", "dense_residual")), (nudge, ("dense_residual",))):
        pack = wt.encode_delta({"w": old}, {"w": target}, base_version=0, version=1)
        assert inspect(pack)["tensors"][0]["codec"] in codecs
        state = {"w": old.clone()}
        wt.apply_delta(state, pack)
        assert_bits_equal(state, {"w": target})


def test_unchanged_tensor_costs_almost_nothing():
    t = torch.randn(1 << 16).to(torch.bfloat16)
    pack = wt.encode_delta({"w": t}, {"w": t.clone()}, base_version=0, version=1)
    info = inspect(pack)
    assert info["tensors"][0]["codec"] == "same" and info["tensors"][0]["bytes"] == 0
    assert len(pack) < 300
