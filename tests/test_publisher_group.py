"""Sharded trainers (torch.distributed, gloo, real processes): each rank encodes and
uploads its own shards and no rank gathers the weights; the weights a subscriber
assembles from the parts are bit-exact against an unsharded run with the same seed."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from datetime import timedelta

import pytest
import torch

from services import free_port

VERSIONS = 5
WORLD = 2
KILLED_AT = 2


class TinyLM(torch.nn.Module):
    """An embedding tied to the output head, uneven dims (13 rows over 2 ranks), a
    column-parallel and a row-parallel linear."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(13, 8)
        self.up, self.down = torch.nn.Linear(8, 11), torch.nn.Linear(11, 8)
        self.head = torch.nn.Linear(8, 13, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(self.down(torch.relu(self.up(self.emb(tokens)))))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyLM().to(torch.bfloat16)


def _train(m, steps):
    """`steps` AdamW steps on a fixed batch; yields after each."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, 13, (4, 6), generator=g)
        opt.zero_grad()
        m(tokens).float().logsumexp(-1).mean().backward()
        opt.step()
        yield


def reference_states() -> list[dict[str, torch.Tensor]]:
    """The unsharded run: the checkpoint after each step."""
    m, out = _model(), []
    for _ in _train(m, VERSIONS):
        out.append({k: v.detach().clone() for k, v in m.state_dict().items()})
    return out


def _tp_shards(state: dict, rank: int):
    """A hand-sharded tensor-parallel layout: `up` column-parallel (rows), `down` row-parallel
    (columns), its bias and the embedding on rank 0 alone, the head's rows split."""
    import weight_teleport as wt

    out, slices = {}, {}
    for name, t in state.items():
        dim = {"up.weight": 0, "up.bias": 0, "down.weight": 1, "head.weight": 0}.get(name)
        if dim is None:
            if rank == 0:
                out[name] = t
            continue
        parts = torch.tensor_split(t, WORLD, dim)
        start = sum(p.shape[dim] for p in parts[:rank])
        box = [(0, d) for d in t.shape]
        box[dim] = (start, parts[rank].shape[dim])
        out[name], slices[name] = parts[rank].contiguous(), wt.TensorSlice(t.shape, box)
    return out, slices


def _rank_main(rank: int, port: int, url: str, layout: str, errors) -> None:
    import torch.distributed as dist

    from weight_teleport.pipeline import PublisherConfig, PublisherGroup

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=120))
        torch.set_num_threads(1)
        m = _model()
        if layout == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (WORLD,))
            for name in ("up", "down"):
                fully_shard(getattr(m, name), mesh=mesh)
            fully_shard(m, mesh=mesh)
        hints = {"down.weight": ("cols", (6 * 8,))}  # a sampler split at column 6
        config = PublisherConfig(anchor_every=3, threads=1, chunk_elems=64)
        with PublisherGroup(url, config, hints=hints) as group:
            for step, _ in enumerate(_train(m, VERSIONS)):
                if layout == "killed" and step == KILLED_AT and rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step < group.next_version:  # a restarted group goes on from the store's latest
                    continue
                if layout == "fsdp":
                    group.publish(m.state_dict(), step)
                else:
                    local, slices = _tp_shards(m.state_dict(), rank)
                    try:
                        group.publish(local, step, slices=slices)
                    except Exception:
                        assert layout == "killed" and step == KILLED_AT, traceback.format_exc()
                        break
        if layout != "killed":
            dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def _run_group(url: str, layout: str) -> None:
    ctx = mp.get_context("spawn")
    errors, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, url, layout, errors)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    found = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert not found, "\n".join(found)
    codes = [p.exitcode for p in procs]
    if layout == "killed":
        assert codes[1] == -signal.SIGKILL and codes[0] == 0, codes
    else:
        assert codes == [0] * WORLD, codes


def _manifest(url):
    from weight_teleport.pipeline.manifest import from_json
    from weight_teleport.store import open_store

    store = open_store(url)
    return store, from_json(store.get_manifest())


def _check_every_version(url, want, versions):
    from weight_teleport.pipeline.fetch import materialize

    store, manifest = _manifest(url)
    assert manifest.latest == versions[-1]
    for v in versions:
        state, got = materialize(store, manifest, v, threads=1)
        assert got == v and state.keys() == want[v].keys()
        for k, t in want[v].items():
            assert torch.equal(state[k].view(torch.int16), t.view(torch.int16)), (v, k)
    return manifest


@pytest.mark.parametrize("layout", ["tp", "fsdp"])
def test_sharded_trainers_publish_parts_that_assemble_bit_exact(tmp_path, layout):
    url = f"file://{tmp_path}/store"
    _run_group(url, layout)
    manifest = _check_every_version(url, reference_states(), list(range(VERSIONS)))
    deltas = [e for e in manifest.entries if e.kind == "delta"]
    assert deltas and all(len(e.parts) == WORLD for e in deltas)
    assert [e.version for e in manifest.anchors] == [0, 3]


def test_a_rank_killed_mid_version_leaves_no_partial_version(tmp_path):
    url = f"file://{tmp_path}/store"
    _run_group(url, "killed")
    _, manifest = _manifest(url)
    assert manifest.latest == KILLED_AT - 1
    want = reference_states()
    _check_every_version(url, want, list(range(KILLED_AT)))
    _run_group(url, "tp")  # the group restarted: its first version is published whole
    manifest = _check_every_version(url, want, list(range(VERSIONS)))
    assert [e.kind for e in manifest.entries if e.version == KILLED_AT] == ["snapshot"]
