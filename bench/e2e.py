"""End-to-end benchmark of the GPU pipeline on one CUDA device: a trainer loop with fp32
masters on the GPU publishing bf16 versions (`Publisher(baseline_device="cuda")`), a store,
and a subscriber following with a `TorchTarget` over GPU weights.

Two transports, one after the other: `memory://` (the subscriber in this process) and the
HTTP origin (`weight-teleport serve`, a separate process on loopback, the subscriber in a
child process). Per version: `publish()` blocking time, encode, upload, fetch, stage,
publish -> ready, pause, bytes; the anchors' encode; a cold start from the newest anchor
(attach -> weights at the latest version); with `--catchup-every N`, catch-up deltas from
version 0 (`PublisherConfig.catchup_every`) and a second cold start by a sampler that holds
version 0 (`initial_version=0`); the subscriber's peak host and GPU memory.
Every version is checked bit for bit (in the child: every tensor's digest against the
trainer's, which the trainer computes from its own bf16 weights).

    python bench/e2e.py [--model qwen3-8b] [--versions 10] [--anchor-every 4] \\
        [--lr 5e-7 --lr 1e-6] [--transport memory --transport http] [--out DIR]
        [--format bf16 --format fp8-block] [--catchup-every 4]

`--format fp8-block`: the samplers hold the block-FP8 checkpoint (`PublisherConfig.
sampler_format`), quantized from the bf16 weights as each version is published; the
memory route checks it against the quantization of the trainer's weights, bit for bit.
Each format runs with a trainer of its own, seeded alike: the same steps, side by side.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from math import prod
from pathlib import Path

import torch

from weight_teleport.bench.simulate import make_config, make_state
from weight_teleport.codec.api import tensor_digests
from weight_teleport.pipeline import PublisherConfig, RetentionConfig, SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.quantize import sampler_format
from weight_teleport.subscribe import Subscriber
from weight_teleport.store import StoreConfig
from weight_teleport.targets.torch import TorchTarget

TOKEN = "e2e-bench-token"
SUB = dict(watch_timeout_s=1.0, retry_backoff_s=0.05, retry_backoff_max_s=0.5)


class Trainer:
    """fp32 masters on the GPU and the bf16 weights published from them; a step moves every
    master by lr * u, u standard normal (an Adam step moves each weight by about lr)."""

    def __init__(self, model: str, device: str, seed: int = 0, fmt: str | None = None):
        self.device, self.format = device, sampler_format(fmt)
        self.master = make_state(make_config(model), seed, device=device)
        self.weights = {k: v.to(torch.bfloat16) for k, v in self.master.items()}
        self.gen = torch.Generator(device=device).manual_seed(seed + 1)
        self.numel = sum(v.numel() for v in self.weights.values())

    def step(self, lr: float) -> float:
        """One step; returns the share of bf16 elements that changed."""
        changed = torch.zeros((), dtype=torch.int64, device=self.device)
        for k, m in self.master.items():
            m.add_(torch.randn(m.shape, generator=self.gen, device=self.device), alpha=-lr)
            new = m.to(torch.bfloat16)
            changed += (new.view(torch.int16) != self.weights[k].view(torch.int16)).sum()
            self.weights[k].copy_(new)
        return int(changed) / self.numel

    def sampler_state(self) -> dict[str, torch.Tensor]:
        """What the samplers hold of the current weights: them, or their quantization."""
        if self.format is None:
            return self.weights
        layout = self.format.layout(self.weights)
        out = {k: torch.empty(shape, dtype=dt, device=self.device) for k, (shape, dt) in layout.items()}
        self.format.quantize(self.weights, out)
        return out

    def layout(self) -> dict:
        """The samplers' tensors: name -> (shape, dtype)."""
        if self.format is None:
            return {k: (tuple(v.shape), v.dtype) for k, v in self.weights.items()}
        return self.format.layout(self.weights)

    def digests(self) -> list[str]:
        return tensor_digests(list(self.sampler_state().values()))


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


class Sampler:
    """Applies every version the subscriber stages, recording when each was ready, its pause
    and the subscriber's counters (runs on a thread of the subscriber's process)."""

    def __init__(self, sub: Subscriber):
        self.sub, self.rows, self.stop = sub, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last = dict(fetch_s=0.0, stage_s=0.0, bytes_fetched=0)
        while not self.stop.is_set():
            if not self.sub.wait(0.05):
                continue
            ready = time.monotonic()
            report = self.sub.apply()
            s = self.sub.stats
            for v in report.versions:
                self.rows[v] = dict(
                    ready=ready,
                    pause_ms=report.pause_s * 1e3,
                    resynced=report.resynced,
                    fetch_s=s.fetch_s - last["fetch_s"],
                    stage_s=s.stage_s - last["stage_s"],
                    fetched=s.bytes_fetched - last["bytes_fetched"],
                    live=self.sub.version,
                )
            last = dict(fetch_s=s.fetch_s, stage_s=s.stage_s, bytes_fetched=s.bytes_fetched)

    def wait_for(self, version: int, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while version not in self.rows and time.monotonic() < deadline:
            time.sleep(0.002)
        return self.rows.get(version)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _gpu_peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None


def subscriber_process(url: str, shapes: dict, device: str, jobs: mp.Queue, out: mp.Queue) -> None:
    """The HTTP case's sampler: follows `url`, reports a row per version (bit-exactness from
    the digests of its live weights against the trainer's), then a cold start."""
    live = {k: torch.zeros(s, dtype=dt, device=device) for k, (s, dt) in shapes.items()}
    with Subscriber(url, TorchTarget(live), SubscriberConfig(**SUB)) as sub:
        sampler = Sampler(sub)
        while (job := jobs.get()) is not None:
            version, digests = job
            row = sampler.wait_for(version, 120)
            if row is not None:
                row["exact"] = tensor_digests(list(live.values())) == digests
            out.put((version, row))
        sampler.close()
    out.put(("memory", dict(host_gb=_peak_rss_gb(), gpu_gb=_gpu_peak_gb())))
    del live
    if device == "cuda":
        torch.cuda.empty_cache()
    latest, digests, boot = jobs.get()
    out.put(("cold", cold_starts(url, shapes, device, latest, digests, boot)))


def cold_starts(url: str, shapes: dict, device: str, latest: int, digests: list[str], boot: str | None) -> dict:
    """The cold start of a sampler holding nothing, and where `boot` (a file of version 0's
    weights) is given, of one holding version 0."""
    out = {"cold": cold_start(url, shapes, device, latest, digests)}
    if boot is not None:
        out["cold_from_boot"] = cold_start(url, shapes, device, latest, digests, torch.load(boot))
    return out


def cold_start(url: str, shapes: dict, device: str, latest: int, digests: list[str], boot: dict | None = None) -> dict:
    """A new subscriber attached to `url`: seconds until its weights are at `latest`. With
    `boot` (version 0's weights), it starts holding them (`initial_version=0`)."""
    if boot is None:
        live = {k: torch.zeros(s, dtype=dt, device=device) for k, (s, dt) in shapes.items()}
    else:
        live = {k: t.to(device) for k, t in boot.items()}
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.monotonic()
    config = SubscriberConfig(**SUB, initial_version=None if boot is None else 0)
    with Subscriber(url, TorchTarget(live), config) as sub:
        sampler = Sampler(sub)
        row = sampler.wait_for(latest, 600)
        sampler.close()
        warm = sub.stats
    done = time.monotonic()
    exact = row is not None and tensor_digests(list(live.values())) == digests
    return dict(
        seconds=done - t0,
        exact=exact,
        fetch_s=warm.fetch_s,
        stage_s=warm.stage_s,
        bytes=warm.bytes_fetched,
        pause_ms=None if row is None else row["pause_ms"],
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_origin(root: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "WEIGHT_TELEPORT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "weight_teleport.cli", "serve", "--root", str(root), "--port", str(port)], env=env
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the origin did not start")


def run(
    transport: str,
    trainer: Trainer,
    lrs: list[float],
    versions: int,
    anchor_every: int,
    codec: str = "sparse",
    catchup_every: int = 0,
) -> dict:
    tmp = tempfile.mkdtemp(prefix="wt-e2e-")
    origin = None
    if transport == "http":
        origin, url = start_origin(Path(tmp))
    else:
        url = f"memory://e2e-{time.monotonic_ns()}"
    device = trainer.device
    config = PublisherConfig(
        baseline_device=device,
        anchor_every=anchor_every,
        catchup_every=catchup_every,
        resume=False,
        codec=codec,
        retention=RetentionConfig(keep_anchors=1),
        sampler_format=None if trainer.format is None else trainer.format.name,
        store=StoreConfig(token=TOKEN),
    )
    shapes = trainer.layout()
    rows, child, sampler, sub, boot = [], None, None, None, None
    pub = Publisher(url, config)
    if transport == "http":
        ctx = mp.get_context("spawn")
        jobs, out = ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=subscriber_process, args=(url, shapes, device, jobs, out))
        child.start()
    else:
        live = {k: torch.zeros(s, dtype=dt, device=device) for k, (s, dt) in shapes.items()}
        sub = Subscriber(url, TorchTarget(live), SubscriberConfig(**SUB))
        sampler = Sampler(sub)
    try:
        for v in range(versions):
            lr = lrs[v % len(lrs)]
            density = trainer.step(lr) if v else 0.0
            if v == 0 and catchup_every:  # what a sampler booted from version 0 holds
                boot = os.path.join(tmp, "boot.pt")
                torch.save({k: t.cpu() for k, t in trainer.sampler_state().items()}, boot)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.monotonic()
            handle = pub.publish(trainer.weights, version=v)
            blocked = time.monotonic() - t0
            result = handle.wait(600)
            digests = trainer.digests() if transport == "http" else None
            if child is not None:
                jobs.put((v, digests))
                got_v, row = out.get(timeout=600)
            else:
                row = sampler.wait_for(v, 600)
                if row is not None:
                    want = trainer.sampler_state()
                    row["exact"] = live.keys() == want.keys() and all(
                        torch.equal(live[k].view(torch.uint8), w.view(torch.uint8)) for k, w in want.items()
                    )
            r = dict(
                version=v,
                lr=lr,
                density=density,
                publish_ms=blocked * 1e3,
                encode_ms=result.encode_s * 1e3,
                upload_ms=result.upload_s * 1e3,
                anchor_encode_ms=result.anchor_encode_s * 1e3,
                catchup_encode_ms=result.catchup_encode_s * 1e3,
                bytes=result.objects[0].size,
                kind=result.objects[0].kind,
                visible_s=result.total_s,
            )
            if row is not None:
                r.update(
                    ready_s=row["ready"] - t0,
                    pause_ms=row["pause_ms"],
                    fetch_ms=row["fetch_s"] * 1e3,
                    stage_ms=row["stage_s"] * 1e3,
                    exact=row["exact"],
                    resynced=row["resynced"],
                )
            rows.append(r)
            print(json.dumps(r), flush=True)
        pub.flush(600)
        anchors = [
            dict(
                version=x.version,
                encode_ms=x.anchor_encode_s * 1e3 or x.encode_s * 1e3,
                store_s=x.anchor_s,
                bytes=[e.size for e in x.objects if e.kind == "snapshot"],
            )
            for x in pub.results
            if any(e.kind == "snapshot" for e in x.objects)
        ]
        latest_digests = trainer.digests()
        if child is not None:
            jobs.put(None)
            memory = out.get(timeout=600)[1]
            jobs.put((versions - 1, latest_digests, boot))
            cold = out.get(timeout=900)[1]
            child.join(60)
        else:
            sampler.close()
            sub.close()
            memory = dict(host_gb=_peak_rss_gb(), gpu_gb=None)
            del live, sub, sampler
            if device == "cuda":
                torch.cuda.empty_cache()
            cold = cold_starts(url, shapes, device, versions - 1, latest_digests, boot)
    finally:
        pub.close()
        if origin is not None:
            origin.terminate()
            origin.wait(30)
    raw = sum(prod(s) * dt.itemsize for s, dt in shapes.values())
    return dict(
        transport=transport,
        format=config.sampler_format or "bf16",
        rows=rows,
        anchors=anchors,
        memory=memory,
        cold=cold,
        raw_bytes=raw,
    )


def table(res: dict) -> str:
    lines = [
        f"## {res['transport']}, {res['format']}  (raw {res['raw_bytes'] / 1e9:.1f} GB)",
        "| v | kind | density | publish ms | encode ms | upload ms | visible s | fetch ms | stage ms "
        "| ready s | pause ms | MB | exact |",
        "|" + "---|" * 13,
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['version']} | {r['kind']}{'+A' if r['anchor_encode_ms'] else ''}"
            f"{'+C' if r['catchup_encode_ms'] else ''} | {r['density']:.2%} "
            f"| {r['publish_ms']:.1f} | {r['encode_ms']:.0f} | {r['upload_ms']:.0f} | {r['visible_s']:.2f} "
            f"| {r.get('fetch_ms', float('nan')):.0f} | {r.get('stage_ms', float('nan')):.0f} "
            f"| {r.get('ready_s', float('nan')):.2f} | {r.get('pause_ms', float('nan')):.1f} "
            f"| {r['bytes'] / 1e6:.0f} | {r.get('exact')} |"
        )
    for a in res["anchors"]:
        gbps = res["raw_bytes"] / (a["encode_ms"] / 1e3) / 1e9 if a["encode_ms"] else 0
        lines.append(
            f"anchor v{a['version']}: encode {a['encode_ms']:.0f} ms ({gbps:.0f} GB/s), "
            f"stored+announced {a['store_s']:.1f} s, {a['bytes']}"
        )
    for r in res["rows"]:
        if r["catchup_encode_ms"]:
            lines.append(f"catch-up delta 0 -> v{r['version']}: encode {r['catchup_encode_ms']:.0f} ms")
    for name, cold in res["cold"].items():
        lines.append(f"{name}: {json.dumps(cold)}")
    lines.append(f"subscriber memory: {json.dumps(res['memory'])}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--versions", type=int, default=10)
    p.add_argument("--anchor-every", type=int, default=4)
    p.add_argument("--lr", type=float, action="append")
    p.add_argument("--catchup-every", type=int, default=0, help="catch-up deltas from version 0 every N versions")
    p.add_argument("--transport", action="append", choices=["memory", "http"])
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of the script")
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--codec", default="sparse", choices=["sparse", "sparse_ac"], help="the codec of a delta's sparse records"
    )
    p.add_argument(
        "--format",
        action="append",
        choices=["bf16", "fp8-block"],
        help="what the samplers hold (default bf16); each format with its own trainer, the same steps",
    )
    args = p.parse_args()
    results = []
    for fmt in args.format or ["bf16"]:
        trainer = Trainer(args.model, args.device, fmt=None if fmt == "bf16" else fmt)
        results += [
            run(t, trainer, args.lr or [5e-7], args.versions, args.anchor_every, args.codec, args.catchup_every)
            for t in args.transport or ["memory", "http"]
        ]
        del trainer
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "e2e.json").write_text(json.dumps(results, indent=1))
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"\n{name}, {args.model}, {args.versions} versions, anchor every {args.anchor_every}")
    for res in results:
        print(table(res))


if __name__ == "__main__":
    main()
