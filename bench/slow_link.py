"""Slow-link benchmark: publisher and origin in one network namespace, subscriber in
another, joined by a veth pair shaped to 1 Gbit/s (tbf on both ends) with 20 ms of delay
each way.

This kernel has no netem qdisc, so the delay comes from a small TCP proxy inside the
subscriber's namespace: every chunk it reads from either side is forwarded 20 ms later
(order kept, many chunks in flight), which adds 40 ms to every round trip without
limiting throughput. The subscriber talks to the origin only through that proxy.

Model: a Qwen3-style decoder with ~0.56B parameters (Qwen3-0.6B shapes, 16 layers),
simulated AdamW steps at lr 2e-6 (weight_teleport.bench.simulate); versions are
generated before the pipeline starts, so training does not compete for the CPU.
Run as root: `python bench/slow_link.py` (prints a JSON summary; cleans up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NS_PUB, NS_SUB = "wt-bench-pub", "wt-bench-sub"
IP_PUB, IP_SUB = "10.77.0.1", "10.77.0.2"
ORIGIN_PORT, PROXY_PORT = 8731, 8732
RATE_BPS, DELAY_S = 1e9, 0.020
TOKEN = "slow-link-bench"


def sh(*cmd: str, check: bool = True) -> None:
    subprocess.run(cmd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def setup_link() -> None:
    """Two namespaces, a veth pair between them, tbf 1 Gbit/s on both ends."""
    for ns in (NS_PUB, NS_SUB):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "wtb-pub", "netns", NS_PUB, "type", "veth", "peer", "name", "wtb-sub", "netns", NS_SUB)
    for ns, dev, ip in ((NS_PUB, "wtb-pub", IP_PUB), (NS_SUB, "wtb-sub", IP_SUB)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh(
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            "1gbit",
            "burst",
            "64kb",
            "latency",
            "50ms",
        )


def teardown_link() -> None:
    for ns in (NS_PUB, NS_SUB):
        sh("ip", "netns", "del", ns, check=False)


# The delaying proxy (runs in the subscriber's namespace).
async def _pipe(reader, writer, delay: float) -> None:
    queue: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    while data := await reader.read(1 << 18):
        queue.put_nowait((time.monotonic() + delay, data))
    queue.put_nowait(None)
    await sender


async def _proxy(delay: float) -> None:
    async def handle(reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(IP_PUB, ORIGIN_PORT)
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", PROXY_PORT)
    async with server:
        await server.serve_forever()


def make_versions(steps: int, lr: float):
    """bf16 states of versions 0..steps (simulated AdamW on a ~0.56B decoder)."""
    from weight_teleport.bench.simulate import AdamWSimulator, ModelConfig, make_state, publish

    config = ModelConfig("qwen3-0.56b", 1024, 3072, 16, 16, 8, 128, 151936)
    master = make_state(config, seed=0)
    trainer = AdamWSimulator(master, seed=0)
    versions = [publish(master)] + [trainer.step(lr) for _ in range(steps)]
    del trainer, master
    return versions


def _wait_file(path: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def run_publisher(work: Path, steps: int, lr: float) -> None:
    """In the publisher's namespace: publish each version once the subscriber is idle."""
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.store import StoreConfig, open_store

    versions = make_versions(steps, lr)
    raw = sum(t.numel() * t.element_size() for t in versions[0].values())
    url, config = f"http://{IP_PUB}:{ORIGIN_PORT}", StoreConfig(token=TOKEN, timeout_s=600)
    with open_store(url, config) as store:
        store.put("reference/full-bf16", bytes(raw))
    (work / "reference").write_text(str(raw))
    records = []
    with Publisher(url, PublisherConfig(anchor_every=1000, store=config)) as pub:
        for v, state in enumerate(versions):
            _wait_file(work / f"go-{v}")
            t = time.time()
            r = pub.publish(state, v).wait()
            records.append(
                {
                    "version": v,
                    "t_publish": t,
                    "snapshot_s": r.snapshot_s,
                    "encode_s": r.encode_s,
                    "upload_s": r.upload_s,
                    "wire_bytes": r.wire_bytes,
                    "raw_bytes": r.raw_bytes,
                }
            )
    (work / "publisher.json").write_text(json.dumps(records))


def run_subscriber(work: Path, steps: int) -> None:
    """In the subscriber's namespace: time a full-weights fetch, then follow the versions."""
    import torch

    from weight_teleport.bench.simulate import tensor_shapes
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.store import StoreConfig, open_store
    from weight_teleport.targets.torch import TorchTarget

    url, config = f"http://127.0.0.1:{PROXY_PORT}", StoreConfig(timeout_s=600)
    _wait_file(work / "reference")
    with open_store(url, config) as store:
        t0 = time.perf_counter()
        full = len(store.get("reference/full-bf16"))
        full_s = time.perf_counter() - t0
    from weight_teleport.bench.simulate import ModelConfig

    shapes = tensor_shapes(ModelConfig("qwen3-0.56b", 1024, 3072, 16, 16, 8, 128, 151936))
    live = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in shapes.items()}
    records = []
    with Subscriber(url, TorchTarget(live), SubscriberConfig(store=config)) as sub:
        for v in range(steps + 1):
            stage_before = sub.stats.stage_s
            (work / f"go-{v}").touch()
            sub.wait()
            t_ready = time.time()
            report = sub.apply()
            records.append(
                {
                    "version": v,
                    "t_ready": t_ready,
                    "pause_s": report.pause_s,
                    "decode_s": sub.stats.stage_s - stage_before,
                    "fetched": report.bytes_fetched,
                    "versions": report.versions,
                }
            )
    out = {"full_bytes": full, "full_fetch_s": full_s, "versions": records}
    (work / "subscriber.json").write_text(json.dumps(out))


def summarize(work: Path) -> dict:
    """Join both sides' records; check the target per version."""
    pub = json.loads((work / "publisher.json").read_text())
    sub = json.loads((work / "subscriber.json").read_text())
    rows = []
    for p, s in zip(pub, sub["versions"]):
        link_s = p["wire_bytes"] * 8 / RATE_BPS
        budget = 1.2 * link_s + 0.2 + p["snapshot_s"] + p["encode_s"] + s["decode_s"]
        ready = s["t_ready"] - p["t_publish"]
        rows.append(
            {
                "version": p["version"],
                "wire_MB": p["wire_bytes"] / 1e6,
                "ratio": p["raw_bytes"] / p["wire_bytes"],
                "snapshot_s": p["snapshot_s"],
                "encode_s": p["encode_s"],
                "upload_s": p["upload_s"],
                "decode_s": s["decode_s"],
                "publish_to_ready_s": ready,
                "target_s": budget,
                "met": ready <= budget,
                "pause_ms": s["pause_s"] * 1e3,
            }
        )
    return {
        "weights_MB": pub[0]["raw_bytes"] / 1e6,
        "full_bf16_fetch_s": sub["full_fetch_s"],
        "full_bf16_MB": sub["full_bytes"] / 1e6,
        "link_MBps_measured": sub["full_bytes"] / sub["full_fetch_s"] / 1e6,
        "versions": rows,
    }


def orchestrate(steps: int, lr: float) -> dict:
    """Set up the link, run origin, proxy, subscriber and publisher, clean up."""
    me, py = str(Path(__file__).resolve()), sys.executable
    procs = []
    setup_link()
    try:
        with tempfile.TemporaryDirectory(prefix="wt-slow-link-") as tmp:
            work = Path(tmp)
            procs.append(subprocess.Popen(["ip", "netns", "exec", NS_PUB, py, me, "origin", str(work / "origin")]))
            procs.append(subprocess.Popen(["ip", "netns", "exec", NS_SUB, py, me, "proxy"]))
            procs.append(subprocess.Popen(["ip", "netns", "exec", NS_SUB, py, me, "subscribe", str(work), str(steps)]))
            time.sleep(2)
            subprocess.run(
                ["ip", "netns", "exec", NS_PUB, py, me, "publish", str(work), str(steps), str(lr)], check=True
            )
            procs[-1].wait(timeout=600)
            return summarize(work)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
        teardown_link()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="all", choices=["all", "origin", "proxy", "publish", "subscribe"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--steps", type=int, default=3, help="delta versions after the anchor")
    parser.add_argument("--lr", type=float, default=2e-6)
    args = parser.parse_args()
    if args.role == "origin":
        from weight_teleport.server import ServerConfig, serve_forever

        serve_forever(ServerConfig(root=Path(args.rest[0]), host=IP_PUB, port=ORIGIN_PORT, token=TOKEN))
    elif args.role == "proxy":
        asyncio.run(_proxy(DELAY_S))
    elif args.role == "publish":
        run_publisher(Path(args.rest[0]), int(args.rest[1]), float(args.rest[2]))
    elif args.role == "subscribe":
        run_subscriber(Path(args.rest[0]), int(args.rest[1]))
    else:
        print(json.dumps(orchestrate(args.steps, args.lr), indent=1))


if __name__ == "__main__":
    main()
