"""Does the sampler's heartbeat delay `Subscriber.apply()`? The pause of every delta
applied, with heartbeats off, at the default interval (5 s), and at 1 ms (a thread sending
heartbeats without rest: the worst case for the GIL), in one process, modes interleaved.

The origin that hears the heartbeats runs in a process of its own (`weight-teleport
serve --port 0`), as it would in a deployment; the packs come from a memory:// store,
published before any subscriber starts, so that nothing else competes for the CPU.
Run: `python bench/investigations/heartbeat.py [--versions 20] [--mb 64] [--rounds 2]` (prints JSON)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace

import torch

from weight_teleport.pipeline import PublisherConfig, SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.targets.torch import TorchTarget

MODES = {"off": None, "every 5 s": 5.0, "every 1 ms": 0.001}


def versions(n: int, mb: int) -> list[dict[str, torch.Tensor]]:
    """`n` versions of 8 bf16 tensors of `mb` MB in all, ~1% of elements moving one ULP."""
    g = torch.Generator().manual_seed(0)
    numel = (mb << 20) // 2 // 8
    state = {f"w{i}": (torch.randn(numel, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)}
    out = [state]
    for _ in range(n - 1):
        nxt = {}
        for k, t in out[-1].items():
            bits = t.view(torch.int16).clone()
            bits[torch.rand(numel, generator=g) < 0.01] += 1
            nxt[k] = bits.view(torch.bfloat16)
        out.append(nxt)
    return out


def pauses(url: str, config: SubscriberConfig, state0, last: int) -> list[float]:
    """Apply every version from 0 to `last`; the pauses of the deltas, in seconds."""
    live = {k: torch.zeros_like(t) for k, t in state0.items()}
    out = []
    with Subscriber(url, TorchTarget(live), config) as sub:
        while sub.version != last:
            if sub.wait(5.0):
                report = sub.apply()
                if report.versions and report.versions[0] > 0:
                    out.append(report.pause_s)
    return out


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("--versions", type=int, default=20)
    cli.add_argument("--mb", type=int, default=64, help="MB of bf16 weights")
    cli.add_argument("--rounds", type=int, default=2)
    args = cli.parse_args()
    with tempfile.TemporaryDirectory() as root:
        origin = subprocess.Popen(
            [sys.executable, "-m", "weight_teleport.cli", "serve", "--root", root, "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            origin_url = origin.stdout.readline().split()[-1]
            url = "memory://heartbeat-bench"
            states = versions(args.versions, args.mb)
            with Publisher(url, PublisherConfig(anchor_every=10**6)) as pub:
                for s in states:
                    pub.publish(s)
                pub.flush()
                base = SubscriberConfig(watch_timeout_s=0.2, report_to=origin_url)
                found: dict[str, list[float]] = {m: [] for m in MODES}
                for _ in range(args.rounds):
                    for mode, every in MODES.items():
                        found[mode] += pauses(url, replace(base, heartbeat_s=every), states[0], args.versions - 1)
        finally:
            origin.terminate()
            origin.wait()
    print(
        json.dumps(
            {
                "mb": args.mb,
                "deltas_per_mode": len(found["off"]),
                "pause_ms": {
                    mode: {
                        "median": round(statistics.median(p) * 1e3, 3),
                        "p90": round(sorted(p)[int(0.9 * (len(p) - 1))] * 1e3, 3),
                        "max": round(max(p) * 1e3, 3),
                    }
                    for mode, p in found.items()
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
