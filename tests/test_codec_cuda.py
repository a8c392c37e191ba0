"""The codec on CUDA tensors: round trips, CPU<->GPU cross decoding, digests, corrupt packs."""

import numpy as np
import pytest
import torch
from helpers import DTYPES, assert_bits_equal, bits, clone_state
from test_codec_roundtrip import make_pair

import weight_teleport as wt
from weight_teleport.codec import digest as D
from weight_teleport.codec.cpu import chunks as C
from weight_teleport.errors import PackFormatError, WeightTeleportError

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda)")]
pytest.importorskip("triton", reason="the CUDA backend needs triton")

MODES = [("none", 0.0), ("single", 0.0), ("density", 0.01), ("density", 0.5), ("all", 0.0)]


def _cuda(state):
    return {k: v.cuda() for k, v in state.items()}


def _cpu(state):
    return {k: v.cpu() for k, v in state.items()}


def _pair(seed, dtype, mode, p, change="ulp", shape=(37, 29)):
    old, new = make_pair(seed, dtype, shape, "weights", mode, change, p)
    return {"w": old, "b": old.flip(0).contiguous()}, {"w": new, "b": new.flip(0).contiguous()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,p", MODES)
@pytest.mark.parametrize("change", ["ulp", "specials"])
def test_gpu_round_trip_and_identical_packs(dtype, mode, p, change):
    old, new = _pair(7, dtype, mode, p, change)
    pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=1, version=2, chunk_elems=256)
    assert pack == wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=256)
    state = _cuda(old)
    report = wt.apply_delta(state, pack, base_version=1)
    assert_bits_equal(_cpu(state), new)
    assert report.digest_verified


@pytest.mark.parametrize("chunk", [8, 24, 4096, 1 << 22])
def test_cross_decoding_both_ways(chunk):
    old, new = _pair(3, torch.bfloat16, "density", 0.03, "random", shape=(300, 77))
    cpu_pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=chunk)
    gpu_pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1, chunk_elems=chunk)
    on_cpu, on_gpu = clone_state(old), _cuda(old)
    wt.apply_delta(on_cpu, gpu_pack)
    wt.apply_delta(on_gpu, cpu_pack)
    assert_bits_equal(on_cpu, new)
    assert_bits_equal(_cpu(on_gpu), new)


def test_non_contiguous_state_and_inputs():
    old, new = make_pair(5, torch.bfloat16, (64, 48), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"x": old.cuda().t()}, {"x": new.cuda().t()}, base_version=0, version=1,
                           chunk_elems=64)
    buf = old.cuda()
    state = {"x": buf.t()}
    wt.apply_delta(state, pack)
    assert_bits_equal({"x": buf.cpu()}, {"x": new})


def test_snapshot_onto_gpu():
    old, _ = _pair(9, torch.float32, "none", 0.0)
    pack = wt.encode_snapshot(_cuda(old), version=5, chunk_elems=40)
    target = {k: torch.zeros_like(v).cuda() for k, v in old.items()}
    wt.apply_delta(target, pack)
    assert_bits_equal(_cpu(target), old)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 3, 8, 1001, 70000])
def test_gpu_digest_matches_cpu(dtype, n):
    from weight_teleport.codec.cuda.digest import digest
    old, _ = make_pair(n, dtype, (n,), "random", "none", "ulp", 0.0)
    u8 = bits(old).view(-1).numpy().view(np.uint8)
    assert digest(old.cuda()) == D.finish(C.digest_sum(u8, 0), u8.size)
    assert digest(old.cuda()[1:]) == D.finish(C.digest_sum(u8[old.element_size():], 0),
                                              max(u8.size - old.element_size(), 0))


def _corrupt(pack: bytes, at: int) -> bytes:
    b = bytearray(pack)
    b[at] ^= 0x5A
    return bytes(b)


def test_corrupt_packs_leave_gpu_weights_untouched():
    old, new = _pair(4, torch.bfloat16, "density", 0.02, shape=(200, 64))
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=1024)
    rng = np.random.default_rng(0)
    for at in rng.integers(0, len(pack), size=40):
        state = _cuda(old)
        with pytest.raises(WeightTeleportError):
            wt.apply_delta(state, _corrupt(pack, int(at)))
        assert_bits_equal(_cpu(state), old)
    with pytest.raises(PackFormatError):
        wt.apply_delta(_cuda(old), pack[:-3])


def test_wrong_base_weights_are_refused():
    old, new = _pair(6, torch.bfloat16, "density", 0.02)
    pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1)
    state = _cuda(new)
    with pytest.raises(WeightTeleportError):
        wt.apply_delta(state, pack)
    assert_bits_equal(_cpu(state), new)


def test_staged_patch_offloaded_to_pinned_host():
    old, new = _pair(8, torch.bfloat16, "density", 0.05, shape=(100, 50))
    pack = wt.encode_delta(old, new, base_version=0, version=1)
    state = _cuda(old)
    staged = wt.stage_delta(state, pack)
    assert staged.nbytes > 0
    staged.offload()
    wt.apply_staged(state, staged)
    assert_bits_equal(_cpu(state), new)
