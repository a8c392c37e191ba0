"""Sharded trainers (torch.distributed, gloo, real processes, 2 and 4 ranks): each rank
encodes and uploads its own shards and no rank gathers the weights. A subscriber with a
full model (TorchTarget) follows the group while it trains, through the file store and the
HTTP origin: every version it applies, and every version read back from the store, is
bit-exact against an unsharded run with the same seed. A rank SIGKILLed mid-version leaves
no partial version, and a restarted group goes on."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import traceback
from datetime import timedelta
from pathlib import Path

import time

import pytest
import torch

from services import TOKEN, free_port, origin  # noqa: F401

VERSIONS = 5
KILLED_AT = 2
WAIT_S = 300


class TinyLM(torch.nn.Module):
    """An embedding tied to the output head, uneven dims (13 rows, 11 columns over 2 or 4
    ranks; 3 elements over 4: one rank holds none), a column-parallel and a row-parallel
    linear."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(13, 8)
        self.up, self.down = torch.nn.Linear(8, 11), torch.nn.Linear(11, 8)
        self.gain = torch.nn.Parameter(torch.ones(3))
        self.head = torch.nn.Linear(8, 13, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        h = self.down(torch.relu(self.up(self.emb(tokens))))
        return self.head(h * self.gain.repeat(3)[:8])


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


def _tp_shards(state: dict, rank: int, world: int):
    """A hand-sharded tensor-parallel layout: `up` column-parallel (rows), `down` row-parallel
    (columns), its bias and the embedding on rank 0 alone, the head's rows split."""
    from weight_teleport.codec import TensorSlice

    out, slices = {}, {}
    for name, t in state.items():
        dim = {"up.weight": 0, "up.bias": 0, "down.weight": 1, "head.weight": 0, "gain": 0}.get(name)
        if dim is None:
            if rank == 0:
                out[name] = t
            continue
        parts = torch.tensor_split(t, world, dim)
        start = sum(p.shape[dim] for p in parts[:rank])
        box = [(0, d) for d in t.shape]
        box[dim] = (start, parts[rank].shape[dim])
        out[name], slices[name] = parts[rank].contiguous(), TensorSlice(t.shape, box)
    return out, slices


def _rank_main(rank: int, world: int, port: int, url: str, layout: str, errors) -> None:
    import torch.distributed as dist

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import PublisherGroup
    from weight_teleport.pipeline.errors import PublishFailed
    from weight_teleport.store import StoreConfig

    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
        )
        torch.set_num_threads(1)
        m = _model()
        if layout == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            for name in ("up", "down"):
                fully_shard(getattr(m, name), mesh=mesh)
            fully_shard(m, mesh=mesh)
        # a sampler split at column 6; under FSDP over 4 ranks a box of 2 rows would be cut
        # into chunks of 2 x 6 elements, not the multiple of 8 that chunks must be
        hints = {"down.weight": ("cols", (6 * 8,))} if layout != "fsdp" or world == 2 else {}
        store = StoreConfig(token=TOKEN) if url.startswith("http") else StoreConfig()
        config = PublisherConfig(anchor_every=3, threads=1, chunk_elems=64, store=store)
        with PublisherGroup(url, config, hints=hints) as group:
            for step, _ in enumerate(_train(m, VERSIONS)):
                if layout == "killed" and step == KILLED_AT and rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step < group.next_version:  # a restarted group goes on from the store's latest
                    continue
                if layout == "fsdp":
                    group.publish(m.state_dict(), step)
                else:
                    local, slices = _tp_shards(m.state_dict(), rank, world)
                    try:
                        group.publish(local, step, slices=slices)
                    except PublishFailed:
                        assert layout == "killed" and step == KILLED_AT, traceback.format_exc()
                        break
        # only the default group's 2 gloo threads are left: close() joined the group's own
        assert _gloo_threads() <= 2, "close() left its group's gloo threads running"
        dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def _gloo_threads() -> int:
    """Worker threads of gloo process groups in this process (2 per group)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names.count("pt_gloo_runloop")


def _run_group(url: str, layout: str, world: int, sub=None, want=None) -> list[int]:
    """Run the ranks to the end; meanwhile apply what `sub` stages, each version checked
    bit for bit against `want`. Returns the versions applied."""
    ctx = mp.get_context("spawn")
    errors, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, url, layout, errors)) for r in range(world)]
    for p in procs:
        p.start()
    applied, deadline = [], time.monotonic() + WAIT_S
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if sub is not None and sub.wait(0.1):
            applied += _apply_checked(sub, want)
        elif sub is None:
            time.sleep(0.1)
    for p in procs:
        p.join(5)
    found = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert not found, "\n".join(found)
    codes = [p.exitcode for p in procs]
    if layout == "killed":
        assert codes[1] == -signal.SIGKILL and codes[0] == 0, codes
    else:
        assert codes == [0] * world, codes
    return applied


def _apply_checked(sub, want) -> list[int]:
    report = sub.apply()
    if report.versions:
        live = sub.target.tensors
        for k, t in want[sub.version].items():
            assert torch.equal(live[k].view(torch.int16), t.view(torch.int16)), (sub.version, k)
    return report.versions


def _follow_to(sub, want, version) -> list[int]:
    applied, deadline = [], time.monotonic() + 60
    while sub.version != version:
        assert time.monotonic() < deadline, f"stuck at {sub.version}: {sub.health}"
        if sub.wait(0.1):
            applied += _apply_checked(sub, want)
    return applied


def _subscriber(url):
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.targets.torch import TorchTarget

    m = _model()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    config = SubscriberConfig(watch_timeout_s=0.2, retry_backoff_s=0.02, retry_backoff_max_s=0.2, threads=1)
    return Subscriber(url, TorchTarget(m), config)


def _manifest(url):
    from weight_teleport.format.manifest import from_json
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


@pytest.mark.parametrize("layout, world, transport", [("fsdp", 2, "http"), ("fsdp", 4, "file"), ("tp", 4, "http")])
def test_sharded_trainers_publish_parts_that_assemble_bit_exact(tmp_path, request, layout, world, transport):
    url = f"file://{tmp_path}/store"
    if transport == "http":
        url = f"http://127.0.0.1:{request.getfixturevalue('origin').port}"
    want = reference_states()
    with _subscriber(url) as sub:
        applied = _run_group(url, layout, world, sub, want)
        applied += _follow_to(sub, want, VERSIONS - 1)
        assert applied == sorted(set(applied)) and applied[-1] == VERSIONS - 1
        assert sub.stats.resyncs == 0 and sub.stats.objects_rejected == 0
    manifest = _check_every_version(url, want, list(range(VERSIONS)))
    deltas = [e for e in manifest.entries if e.kind == "delta"]
    assert deltas and all(len(e.parts) == world for e in deltas)
    assert [e.version for e in manifest.anchors] == [0, 3]
    assert all(len(e.parts) == world for e in manifest.anchors)


def test_a_rank_killed_mid_version_leaves_no_partial_version(tmp_path):
    url = f"file://{tmp_path}/store"
    want = reference_states()
    with _subscriber(url) as sub:
        applied = _run_group(url, "killed", 2, sub, want)
        _, manifest = _manifest(url)
        assert manifest.latest == KILLED_AT - 1
        applied += _follow_to(sub, want, KILLED_AT - 1)
        _check_every_version(url, want, list(range(KILLED_AT)))
        applied += _run_group(url, "tp", 2, sub, want)  # restarted: its first version is published whole
        applied += _follow_to(sub, want, VERSIONS - 1)
        assert applied == sorted(set(applied))
    manifest = _check_every_version(url, want, list(range(VERSIONS)))
    assert [e.kind for e in manifest.entries if e.version == KILLED_AT] == ["snapshot"]
