"""Engine workers on CUDA parameters stage on their GPU: the slices of a TP=1 and a TP=2
layout (fused qkv / gate_up rows read in place, row-parallel columns through strided
views), packs a GPU publisher cut at their bounds, chained versions staged ahead of the
pause (a copy of the slices on the device, or on the host where the device has no room),
patches that stay on the device, a corrupt run of chunks refused with nothing written, and
bit-exact weights after each commit. Skipped without a CUDA device."""

import dataclasses

import pytest
import torch

from helpers import bits, with_renewed_crcs
from test_slice_stage import CONFIG, _mutate, _state, engine_params
from weight_teleport import codec
from weight_teleport.codec import walks as W
from weight_teleport.codec.cuda.stage.patch import DevicePatch
from weight_teleport.errors import WeightTeleportError
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.format.manifest import from_json
from weight_teleport.store import open_store
from weight_teleport.targets import slice_stage
from weight_teleport.targets.slice_stage import apply_steps, stage_entry, warm_up
from weight_teleport.targets.slice_view import box_view
from weight_teleport.targets.vllm_layout import slice_hints, worker_slices

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _published(url: str, tp_sizes, n: int, density: float = 0.03, seed: int = 0) -> list[dict]:
    """Versions 1..n published from CUDA weights (the GPU encoder cuts them at the slices'
    bounds); the CPU states."""
    gen = torch.Generator().manual_seed(seed)
    states = [_state(gen)]
    for k in range(n - 1):
        states.append(_mutate(states[-1], 0.4 if k == 1 else density, gen))  # one with dense records
    config = PublisherConfig(hints=slice_hints(CONFIG, tp_sizes), baseline_device="cuda", chunk_elems=512, resume=False)
    with Publisher(url, config) as pub:
        for v, st in enumerate(states, start=1):
            pub.publish({k: t.cuda() for k, t in st.items()}, version=v).wait()
    return states


def _on_device(step) -> bool:
    for p in step.patches:
        arrays = [a for g in p.groups for a in g.arrays()]
        arrays += [a for t in p.tensors for a in (t.positions, t.values) if a is not None]
        arrays += [v for t in p.tensors for _, v in t.dense]
        if not isinstance(p, DevicePatch) or not all(a.is_cuda for a in arrays):
            return False
    return True


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("shadow", ["device", "host"])
def test_cuda_workers_stage_chained_versions_on_their_gpu(tp, shadow, monkeypatch):
    if shadow == "host":  # no room on the device for a copy of the slices
        monkeypatch.setattr(slice_stage, "SHADOW_HEADROOM", 1 << 62)
    url = f"memory://worker-cuda-{tp}-{shadow}"
    states = _published(url, [1, 2], 5)
    store = open_store(url)
    entries = [e for e in from_json(store.get_manifest()).entries if e.kind == "delta"]
    assert len(entries) == 4
    for rank in range(tp):
        slices = worker_slices(CONFIG, tp, rank) if tp == 2 else worker_slices(CONFIG, 1, 0)
        params = (
            {n: p.cuda() for n, p in engine_params(states[0], rank).items()}
            if tp == 2
            else {n: p.cuda() for n, p in _tp1_params(states[0]).items()}
        )
        first = stage_entry(store, entries[0], params, slices)
        assert _on_device(first) and not first.relocate
        apply_steps(params, [first])
        _check(params, states[1], tp, rank)
        chain = []
        for e in entries[1:]:  # staged ahead of the pause, each after the ones before
            chain.append(stage_entry(store, e, params, slices, pending=chain))
        assert all(s.relocate for s in chain[1:])
        assert all(_on_device(s) for s in chain[:1] + (chain[1:] if shadow == "device" else []))
        apply_steps(params, chain)
        _check(params, states[-1], tp, rank)


def _tp1_params(state: dict) -> dict:
    """What a TP=1 vLLM worker's loader makes of checkpoint `state`."""
    params = {}
    for s in worker_slices(CONFIG, 1, 0).values():
        params.setdefault(s.param, torch.zeros(s.param_shape, dtype=torch.bfloat16))
    for name, s in worker_slices(CONFIG, 1, 0).items():
        box_view(params[s.param], s).copy_(state[name])
    return params


def _check(params: dict, state: dict, tp: int, rank: int) -> None:
    want = engine_params(state, rank) if tp == 2 else _tp1_params(state)
    for name, t in want.items():
        assert torch.equal(bits(params[name].cpu()), bits(t)), name


def test_a_corrupt_run_of_chunks_is_refused_on_the_gpu_with_nothing_written():
    url = "memory://worker-cuda-corrupt"
    states = _published(url, [2], 2)
    store = open_store(url)
    entry = next(e for e in from_json(store.get_manifest()).entries if e.kind == "delta")
    data = store.get(entry.key)
    refused = 0
    for k in range(8):

        def mutate(i: int, chunk: bytearray) -> None:
            if i == 2 * k + 1 and len(chunk) > 3:
                chunk[3] = (chunk[3] + 1 + k) % 256

        bad = with_renewed_crcs(data, mutate)
        store.put(f"{entry.key}.bad{k}", bad)
        bad_entry = dataclasses.replace(entry, key=f"{entry.key}.bad{k}", size=len(bad))
        for rank in range(2):
            params = {n: p.cuda() for n, p in engine_params(states[0], rank).items()}
            before = {n: bits(p.cpu()) for n, p in params.items()}
            try:
                step = stage_entry(store, bad_entry, params, worker_slices(CONFIG, 2, rank))
            except WeightTeleportError:
                refused += 1
                assert all(torch.equal(bits(params[n].cpu()), before[n]) for n in params)
                continue
            apply_steps(params, [step])  # a byte no decoder reads: the right weights
            _check(params, states[1], 2, rank)
    assert refused >= 4


def test_gpu_encoder_cuts_packs_as_the_cpu_does():
    """Records over walks from CUDA weights (cut at slice bounds by rows and by columns, a
    digest per chunk), through the warp kernels of a real GPU: the CPU's bytes."""
    gen = torch.Generator().manual_seed(2)
    old = _state(gen)
    new = _mutate(old, 0.05, gen)
    hints = slice_hints(CONFIG, [2, 4])
    want = codec.encode_delta(old, new, base_version=1, version=2, chunk_elems=512, hints=hints)
    got = codec.encode_delta(
        {k: v.cuda() for k, v in old.items()},
        {k: v.cuda() for k, v in new.items()},
        base_version=1,
        version=2,
        chunk_elems=512,
        hints=hints,
    )
    assert bytes(got) == bytes(want)


def test_warm_up_stages_slices_of_every_dtype():
    warm_up(torch.device("cuda"), {torch.bfloat16, torch.float32, torch.float16})
    live = {"w": torch.zeros(64, 64, dtype=torch.bfloat16, device="cuda")[:, 8:40]}
    held = {"w": W.TensorSlice((64, 64), ((0, 64), (8, 32)))}
    new = torch.randn(64, 64).bfloat16()
    pack = codec.encode_snapshot({"w": new}, version=1, hints={"w": W.Hint("cols", (8 * 64, 40 * 64))})
    codec.apply_delta(live, pack, held=held)
    assert torch.equal(bits(live["w"].cpu()), bits(new[:, 8:40].contiguous()))
