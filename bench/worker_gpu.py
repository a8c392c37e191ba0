"""Engine workers on one CUDA device, no engine: the parameters laid out exactly as vLLM's
tensor-parallel workers hold them (`targets.vllm_layout.worker_slices`: fused qkv_proj /
gate_up_proj, column-, row- and vocab-parallel shards), each rank a `WorkerLocal` (the
code a vLLM or SGLang worker runs) following a store while a trainer publishes, beside the
`TorchTarget` route on the same versions as the reference. A mixture-of-experts model
(`--model qwen3-30b-a3b`, vLLM's fused-MoE layout, cut to `--layers`) adds the route `ep2`.

Routes, one after another in this process, each with its own trainer and publisher over
the same versions (seeded): `torch` (a Subscriber with a TorchTarget over the checkpoint's
tensors), `tp1` (one worker), `tp2` (both ranks of TP=2 on this one GPU), `ep2` (both
ranks of TP=2 with expert parallelism: each holds half the experts whole). The trainer holds
bf16 weights on the GPU and moves `density` of them by one unit in the last place per
version; its publisher encodes on the GPU (`baseline_device="cuda"`, with the slice hints
of TP=1 and TP=2 for the worker routes). Every sampler starts from version 0 (the
checkpoint it booted from). Per version: publish -> staged on every rank, each rank's
stage and bytes fetched, the commit (the pause: the apply and the device synchronisation;
for the TorchTarget route, `Subscriber.apply`), host and device memory added since the
workers attached, and bit-exactness against the engine's layout of the trainer's weights.

    python bench/worker_gpu.py [--model qwen3-8b] [--versions 6] [--density 0.027] \\
        [--transport memory --transport http] [--route torch --route tp1 --route tp2] [--out DIR]
        [--device cpu]  (a smoke run on a machine without a GPU)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import shutil
import socket
import tempfile
import time
from math import prod
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from e2e import TOKEN, Sampler, start_origin
from weight_teleport.bench.simulate import make_config, make_state, tensor_shapes
from weight_teleport.pipeline import PublisherConfig, SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.store import StoreConfig, memory
from weight_teleport.targets.slice_stage import held_box, stage_entry
from weight_teleport.targets.slice_view import box_view
from weight_teleport.targets.torch import TorchTarget
from weight_teleport.targets.vllm_layout import slice_hints, worker_slices
from weight_teleport.targets.worker_local import TeleportInitInfo, TeleportUpdateInfo, WorkerLocal


APPLY_TOGETHER = False
"""`--apply-together`: the ranks sharing this one device apply their commits at the same time
(else one after another, as ranks each on a device of its own would not contend for its
memory bandwidth; the pause of each is timed once its turn has come)."""
PROFILE = False
"""`--profile`: print where one worker stage spends its time (cProfile)."""
DEVICE = "cuda"
"""Where the weights live (`--device cpu`: a smoke run of the script on a machine without a GPU)."""


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


MOE = {
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "tie_word_embeddings": False,
    }
}
"""Mixture-of-experts models by their config (vLLM's fused-MoE layout), cut to `--layers`."""


def hf_config(name: str, layers: int | None = None) -> dict:
    if name in MOE:
        return {**MOE[name], **({"num_hidden_layers": layers} if layers else {})}
    c = make_config(name)
    return {
        "model_type": "qwen3",
        "vocab_size": c.vocab,
        "hidden_size": c.hidden,
        "intermediate_size": c.intermediate,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "tie_word_embeddings": False,
    }


class Trainer:
    """bf16 weights on the GPU; a step moves `density` of them by one unit in the last place."""

    def __init__(self, model: str, seed: int = 0, layers: int | None = None):
        self.weights = {}
        if model in MOE:  # every checkpoint tensor the layout names, N(0, 0.02)
            gen = torch.Generator(device=DEVICE).manual_seed(seed)
            for s in worker_slices(hf_config(model, layers), 1, 0).values():
                w = torch.empty(s.shape, dtype=torch.bfloat16, device=DEVICE)
                self.weights[s.name] = w.normal_(0, 0.02, generator=gen)
        else:
            master = make_state(make_config(model), seed, device=DEVICE)
            for k in list(master):
                self.weights[k] = master.pop(k).to(torch.bfloat16)
        self.gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)

    def step(self, density: float) -> None:
        for w in self.weights.values():
            u = w.view(torch.int16)
            r = torch.rand(u.shape, generator=self.gen, device=u.device)
            u += (r < density / 2).to(torch.int16)
            u -= (r > 1 - density / 2).to(torch.int16)
        sync()


def engine_params(weights: dict, config: dict, tp: int, rank: int, ep: bool = False) -> dict:
    """What a vLLM worker's loader makes of the checkpoint `weights`: its own parameters
    (`ep`: its experts whole, with expert parallelism)."""
    slices = worker_slices(config, tp, rank, ep)
    params = {}
    for s in slices.values():
        params.setdefault(s.param, torch.zeros(s.param_shape, dtype=torch.bfloat16, device=DEVICE))
    for name, s in slices.items():
        box_view(params[s.param], s).copy_(weights[name][tuple(slice(o, o + e) for o, e in held_box(s))])
    return params


def exact(params: dict, weights: dict, config: dict, tp: int, rank: int, ep: bool = False) -> bool:
    for name, s in worker_slices(config, tp, rank, ep).items():
        want = weights[name][tuple(slice(o, o + e) for o, e in held_box(s))]
        if not torch.equal(box_view(params[s.param], s).view(torch.int16), want.view(torch.int16)):
            return False
    return True


def _store_bytes(url: str, since: int) -> int:
    """Bytes a `memory://` store of this process holds beyond `since` (0 for other stores):
    what the host memory added by the sampler leaves out."""
    shared = memory._NAMES.get(url.partition("://")[2]) if url.startswith("memory://") else None
    return 0 if shared is None else sum(len(v) for v in shared.objects.values()) - since


def device_marker() -> int:
    """Device memory torch holds now, its peak counted from here (0 on a CPU run). Taken
    when `publish` returns: the encoder's memory is freed, and a sampler's stage has
    reached at most its reads (its first device memory is the pack's copy)."""
    if DEVICE != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def device_added(marker: int) -> int:
    """The most device memory held since `device_marker` gave `marker`, beyond it."""
    return torch.cuda.max_memory_allocated() - marker if DEVICE == "cuda" else 0


def pinned() -> int:
    """Bytes of pinned host memory torch's host allocator holds (in use or cached): part of
    `rss`, the buffers the samplers fetch into among them (0 on a CPU run)."""
    if DEVICE != "cuda":
        return 0
    stats = torch.cuda.host_memory_stats()
    return int(stats.get("allocated_bytes.current", stats.get("reserved_bytes.current", 0)))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRank:
    """A worker rank in this process (beside the trainer and its publisher)."""

    def __init__(self, params: dict, slices: dict, rank: int, url: str):
        self.worker = WorkerLocal(lambda: params, slices, rank, None, torch.device(DEVICE))
        self.worker.start(TeleportInitInfo(url, initial_version=0, watch_timeout_s=1.0, read_token=None))

    def staged(self, v: int) -> bool:
        return v in self.worker.status()["staged_at"]

    def status(self) -> dict:
        return self.worker.status()

    def commit_start(self, v: int) -> None:
        self.outcome = self.worker.commit(TeleportUpdateInfo(v)).name

    def commit_end(self) -> str:
        return self.outcome

    def attached(self) -> None:
        pass

    def close(self) -> None:
        self.worker.shutdown()


def rank_process(
    conn, params: dict, slices: dict, rank: int, url: str, device: str, group: tuple[int, int], turn
) -> None:
    """A worker rank in a process of its own, as an engine runs one per rank: its parameters
    are the bench's (CUDA IPC), its memory its own. Answers ("status", v) with its status
    once it has staged v (the host memory, pinned memory and device memory it added since
    attaching in it), ("commit", v) with the outcome, "stop" by leaving. The ranks commit
    together on a gloo group of their own (`group`: its port, its size), as an engine's do;
    `turn` (a lock shared by the ranks, or None) makes them apply after the vote one at a time."""
    global DEVICE
    DEVICE = device  # a spawned process starts from this module's defaults
    if DEVICE == "cuda":
        torch.cuda.set_device(next(iter(params.values())).device)
    port, size = group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    worker = WorkerLocal(lambda: params, slices, rank, None, torch.device(DEVICE))
    if turn is not None:
        apply = worker._apply

        def in_turn(steps) -> None:
            with turn:
                apply(steps)

        worker._apply = in_turn  # type: ignore[method-assign]
    worker.start(TeleportInitInfo(url, initial_version=0, watch_timeout_s=1.0, read_token=None))
    host0, pinned0, dev0 = rss(), pinned(), device_marker()  # attached: its modules loaded, its kernels warm
    conn.send("attached")
    try:
        while (msg := conn.recv()) != "stop":
            what, v = msg
            if what == "commit":
                conn.send(worker.commit(TeleportUpdateInfo(v)).name)
                continue
            deadline = time.monotonic() + 600
            while v not in worker.status()["staged_at"] and time.monotonic() < deadline:
                time.sleep(0.005)
            conn.send(
                {
                    **worker.status(),
                    "host_added": rss() - host0,
                    "pinned_added": pinned() - pinned0,
                    "device_added": device_added(dev0),
                }
            )
            dev0 = device_marker()  # the next version's stage starts after this one's commit
    finally:
        worker.shutdown()
        dist.destroy_process_group()


class ProcessRank:
    """A worker rank in a child process (`rank_process`)."""

    def __init__(self, params: dict, slices: dict, rank: int, url: str, group: tuple[int, int], turn=None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=rank_process, args=(child, params, slices, rank, url, DEVICE, group, turn), daemon=True
        )
        self.proc.start()
        self.last: dict = {}

    def attached(self) -> None:
        if not self.conn.poll(600) or self.conn.recv() != "attached":
            raise RuntimeError("a rank's process did not attach")

    def staged(self, v: int) -> bool:
        self.conn.send(("status", v))
        self.last = self.conn.recv()
        return v in self.last["staged_at"]

    def status(self) -> dict:
        return self.last

    def commit_start(self, v: int) -> None:
        self.conn.send(("commit", v))

    def commit_end(self) -> str:
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send("stop")
        self.proc.join(60)


def workers_route(
    url: str,
    trainer: Trainer,
    pub: Publisher,
    config: dict,
    tp: int,
    versions: int,
    density: float,
    processes: bool,
    ep: bool = False,
) -> list[dict]:
    """`processes`: each rank in a child process, its memory measured there (else every rank
    in this process, whose memory holds the trainer's publisher too). `ep`: the ranks hold
    their experts whole (expert parallelism)."""
    params = [engine_params(trainer.weights, config, tp, r, ep) for r in range(tp)]
    sync()
    release = processes and DEVICE == "cuda"  # the ranks' processes draw on the device memory this one caches
    if release:
        torch.cuda.empty_cache()
    host0, host_store0, pinned0 = rss(), _store_bytes(url, 0), pinned()
    ranks = []
    try:
        group = (_free_port(), tp)
        turn = None if APPLY_TOGETHER or DEVICE != "cuda" else mp.get_context("spawn").Lock()
        for r in range(tp):
            slices = worker_slices(config, tp, r, ep)
            ranks.append(
                ProcessRank(params[r], slices, r, url, group, turn)
                if processes
                else LocalRank(params[r], slices, r, url)
            )
        for rk in ranks:
            rk.attached()
        rows = []
        for v in range(1, versions + 1):
            trainer.step(density)
            t0 = time.time()
            result = pub.publish(trainer.weights, version=v).wait(600)
            if release:
                torch.cuda.empty_cache()
            dev0 = device_marker()
            deadline = time.monotonic() + 600
            while not all(rk.staged(v) for rk in ranks) and time.monotonic() < deadline:
                time.sleep(0.005)  # ready_s is the workers' own clock; polling takes the GIL from them
            st = [rk.status() for rk in ranks]
            ready = max(s["staged_at"][v] for s in st) - t0
            if processes:  # the ranks' own, added up
                host_added, pinned_added, dev_added = (
                    sum(s[k] for s in st) for k in ("host_added", "pinned_added", "device_added")
                )
            else:
                host_added = rss() - host0 - _store_bytes(url, host_store0)
                pinned_added, dev_added = pinned() - pinned0, device_added(dev0)
            if PROFILE and not processes and v == versions:
                profile_stage(ranks[0].worker, v, params[0])
            for rk in ranks:  # together: the ranks of a process each vote on their group
                rk.commit_start(v)
            outcomes = [rk.commit_end() for rk in ranks]
            if processes:
                [rk.staged(v) for rk in ranks]  # the status after the commit
            st = [rk.status() for rk in ranks]
            size = result.objects[0].size
            rows.append(
                dict(
                    version=v,
                    pack_bytes=size,
                    ready_s=ready,
                    outcomes=outcomes,
                    stage_ms=[s["stage_s"][v] * 1e3 for s in st],
                    fetch_ms=[s["fetch_s"][v] * 1e3 for s in st],
                    pause_ms=[s["apply_s"].get(v, float("nan")) * 1e3 for s in st],
                    fetched=[s["fetched"][v] for s in st],
                    fetched_share=[s["fetched"][v] / size for s in st],
                    patch_bytes=[s["patch_bytes"][v] for s in st],
                    host_added=host_added,
                    pinned_added=pinned_added,
                    device_added=dev_added,
                    param_bytes=[sum(p.numel() * p.element_size() for p in params[r].values()) for r in range(tp)],
                    exact=all(exact(params[r], trainer.weights, config, tp, r, ep) for r in range(tp)),
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for rk in ranks:
            rk.close()
    return rows


PHASES = [
    (
        "weight_teleport.targets.slice_stage",
        ["read_pack_header", "_chunk_ranges", "_fetch_into", "stage_delta", "bind_staged"],
    ),
    ("weight_teleport.codec.api", ["_lives"]),
    ("weight_teleport.codec.cuda.stage.staging", ["windowed", "_on_host", "_patch", "_read_back", "word_sums"]),
]
"""Functions `phases` times: (module, names)."""


def phases(stage) -> dict[str, float]:
    """Milliseconds of wall time spent in each function of PHASES (the device synchronised
    after each) while `stage()` runs: where a stage's time goes, without a profiler's
    overhead on Python code. The synchronisations serialise host and device work: the sum
    is an upper bound of the stage."""
    import importlib

    spent, saved = {}, []

    def timed(name, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync()
                spent[name] = spent.get(name, 0.0) + (time.perf_counter() - t0) * 1e3

        return run

    for module, names in PHASES:
        m = importlib.import_module(module)
        for n in names:
            saved.append((m, n, getattr(m, n)))
            setattr(m, n, timed(n, getattr(m, n)))
    t0 = time.perf_counter()
    try:
        stage()
        sync()
    finally:
        for m, n, fn in saved:
            setattr(m, n, fn)
    spent["whole stage"] = (time.perf_counter() - t0) * 1e3
    return spent


def profile_stage(worker: WorkerLocal, v: int, params: dict) -> None:
    """Version `v` staged once more on `worker`, in this thread: its phases' wall times
    (`phases`), where its host time goes (cProfile), then the device's share kernel by
    kernel (torch's profiler)."""
    f = worker.follower
    entry = next(e for e in f.manifest.entries if e.version == v)
    for _ in range(2):
        t0 = time.perf_counter()
        stage_entry(f.store, entry, params, f.slices, views=f.views)
        print(f"stage alone: {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
    print(
        "phases (ms): "
        + json.dumps(
            {
                k: round(x, 1)
                for k, x in phases(lambda: stage_entry(f.store, entry, params, f.slices, views=f.views)).items()
            }
        ),
        flush=True,
    )
    prof = cProfile.Profile()
    prof.enable()
    stage_entry(f.store, entry, params, f.slices, views=f.views)
    sync()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if DEVICE == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as kprof:
            stage_entry(f.store, entry, params, f.slices, views=f.views)
            sync()
        print(kprof.key_averages().table(sort_by="cuda_time_total", row_limit=30))


def torch_route(url: str, trainer: Trainer, pub: Publisher, versions: int, density: float) -> list[dict]:
    live = {k: v.clone() for k, v in trainer.weights.items()}
    sync()
    host0, host_store0, pinned0 = rss(), _store_bytes(url, 0), pinned()
    rows = []
    with Subscriber(
        url,
        TorchTarget(live),
        SubscriberConfig(initial_version=0, watch_timeout_s=1.0, retry_backoff_s=0.05, retry_backoff_max_s=0.5),
    ) as sub:
        sampler = Sampler(sub)
        try:
            for v in range(1, versions + 1):
                trainer.step(density)
                t0 = time.monotonic()
                result = pub.publish(trainer.weights, version=v).wait(600)
                dev0 = device_marker()
                row = sampler.wait_for(v, 600)
                rows.append(
                    dict(
                        version=v,
                        pack_bytes=result.objects[0].size,
                        ready_s=row["ready"] - t0,
                        stage_ms=[(row["fetch_s"] + row["stage_s"]) * 1e3],
                        fetch_ms=[row["fetch_s"] * 1e3],
                        pause_ms=[row["pause_ms"]],
                        fetched=[row["fetched"]],
                        fetched_share=[row["fetched"] / result.objects[0].size],
                        patch_bytes=[float("nan")],
                        host_added=rss() - host0 - _store_bytes(url, host_store0),
                        pinned_added=pinned() - pinned0,
                        device_added=device_added(dev0),
                        exact=all(
                            torch.equal(live[k].view(torch.int16), w.view(torch.int16))
                            for k, w in trainer.weights.items()
                        ),
                    )
                )
                print(json.dumps(rows[-1]), flush=True)
        finally:
            sampler.close()
    return rows


def run(route: str, transport: str, args) -> dict:
    config = hf_config(args.model, args.layers)
    trainer = Trainer(args.model, layers=args.layers)
    origin, root = None, Path(tempfile.mkdtemp(prefix="wt-worker-"))
    if transport == "http":
        origin, url = start_origin(root)
    else:
        url = f"memory://worker-{route}-{time.monotonic_ns()}"
    moe = args.model in MOE
    hints = None if route == "torch" else slice_hints(config, [1, 2], expert_parallel=(False, True) if moe else False)
    pc = PublisherConfig(
        baseline_device=DEVICE, anchor_every=1 << 20, resume=False, hints=hints, store=StoreConfig(token=TOKEN)
    )
    try:
        with Publisher(url, pc) as pub:
            t0 = time.monotonic()
            pub.publish(trainer.weights, version=0).wait(1200)
            print(f"{route}/{transport}: version 0 published in {time.monotonic() - t0:.1f} s", flush=True)
            if route == "torch":
                rows = torch_route(url, trainer, pub, args.versions, args.density)
            else:
                rows = workers_route(
                    url,
                    trainer,
                    pub,
                    config,
                    1 if route == "tp1" else 2,
                    args.versions,
                    args.density,
                    args.processes,
                    ep=route == "ep2",
                )
    finally:
        if origin is not None:
            origin.terminate()
            origin.wait(30)
        shutil.rmtree(root, ignore_errors=True)  # the route's store: a version 0 of the model's size
        memory._NAMES.pop(url.partition("://")[2], None)
    return dict(route=route, transport=transport, processes=args.processes and route != "torch", rows=rows)


def table(results: list[dict], raw_gb: float) -> str:
    med = lambda xs: sorted(xs)[len(xs) // 2]
    lines = [
        f"weights {raw_gb:.1f} GB bf16; medians over versions 2.. (version 1 in brackets)",
        "| route | transport | pack MB | ready s | fetch + stage ms (per rank) | of which fetch ms "
        "| pause ms (per rank) | rank GB | fetched share | patch MB (per rank) | host +GB (pinned) "
        "| device +GB | exact |",
        "|" + "---|" * 13,
    ]
    for r in results:
        rows = r["rows"][1:] or r["rows"]
        ranks = len(rows[0]["stage_ms"])
        per = lambda key: " / ".join(f"{med([x[key][k] for x in rows]):.1f}" for k in range(ranks))
        share = " / ".join(f"{med([x['fetched_share'][k] for x in rows]):.2f}" for k in range(ranks))
        first = r["rows"][0]
        rank_gb = lambda row: " / ".join(f"{b / 1e9:.1f}" for b in row.get("param_bytes", [])) or "-"
        lines.append(
            f"| {r['route']}{' (processes)' if r.get('processes') else ''} | {r['transport']} | {med([x['pack_bytes'] for x in rows]) / 1e6:.0f} "
            f"| {med([x['ready_s'] for x in rows]):.3f} ({first['ready_s']:.3f}) | {per('stage_ms')} "
            f"| {per('fetch_ms')} "
            f"| {per('pause_ms')} | {rank_gb(rows[-1])} | {share} | {' / '.join(f'{b / 1e6:.0f}' for b in rows[-1]['patch_bytes'])} "
            f"| {max(x['host_added'] for x in r['rows']) / 1e9:.2f} "
            f"({max(x['pinned_added'] for x in r['rows']) / 1e9:.2f}) "
            f"| {max(x['device_added'] for x in r['rows']) / 1e9:.2f} "
            f"| {all(x['exact'] for x in r['rows'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--density", type=float, default=0.027)
    ap.add_argument("--transport", action="append", choices=["memory", "http"])
    ap.add_argument(
        "--route",
        action="append",
        choices=["torch", "tp1", "tp2", "ep2"],
        help="ep2: two ranks with expert parallelism (a MoE model)",
    )
    ap.add_argument("--layers", type=int, default=None, help="cut the model to this many layers")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--apply-together",
        action="store_true",
        help="rank processes sharing the one GPU apply at the same time, contending for its memory",
    )
    ap.add_argument(
        "--processes",
        action="store_true",
        help="each worker rank in a process of its own (not with the memory:// store)",
    )
    args = ap.parse_args()
    global DEVICE, PROFILE, APPLY_TOGETHER
    DEVICE, PROFILE, APPLY_TOGETHER = args.device, args.profile, args.apply_together
    if args.processes and "memory" in (args.transport or ["memory"]):
        ap.error("--processes needs a store other processes reach: --transport http")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    results = []
    for transport in args.transport or ["memory", "http"]:
        for route in args.route or ["torch", "tp1", "tp2"]:
            results.append(run(route, transport, args))
            gc.collect()  # the route's trainer, publisher baseline and sampler weights, before the next one's
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    if args.model in MOE:
        raw = sum(prod(s.shape) for s in worker_slices(hf_config(args.model, args.layers), 1, 0).values()) * 2 / 1e9
    else:
        raw = sum(torch.Size(s).numel() for s in tensor_shapes(make_config(args.model)).values()) * 2 / 1e9
    text = table(results, raw)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "worker_gpu.json").write_text(json.dumps(results, indent=1))
        (Path(args.out) / "worker_gpu.md").write_text(text + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
