"""`weight-teleport demo`: a trainer publishes bf16 weights after every AdamW step, a
sampler copy follows through deltas alone, verified bit for bit.

Trainer and sampler run in one process here and share nothing but the pack bytes; the
disaggregated run over the HTTP origin comes with the publisher/subscriber pipeline."""

import argparse
import time

import torch

from weight_teleport.bench.simulate import AdamWSimulator, make_config, make_state, publish
from weight_teleport.codec import apply_delta, decode_snapshot, encode_delta, encode_snapshot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="small", choices=["tiny", "small", "qwen3-0.6b"],
                        help="model shapes (weights are generated, nothing is downloaded)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps to publish")
    parser.add_argument("--lr", type=float, default=2e-6, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="weights and gradient seed")


def _same_bits(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.lr <= 0:
        raise SystemExit("demo: --steps must be >= 1 and --lr > 0")
    config = make_config(args.config)
    master = make_state(config, args.seed)
    trainer = AdamWSimulator(master, args.seed)
    published = publish(master)
    full = sum(t.numel() * 2 for t in published.values())
    anchor = encode_snapshot(published, version=0)
    sampler = decode_snapshot(anchor)
    print(f"{config.name}: {full / 1e6:.1f} MB of bf16 weights; anchor snapshot {len(anchor) / 1e6:.1f} MB "
          f"({len(anchor) / full:.0%})")
    print(f"{'version':>7} {'changed':>8} {'wire':>10} {'of full':>8} {'encode ms':>9} "
          f"{'apply ms':>8} {'verified':>8}")
    total = 0
    for version in range(1, args.steps + 1):
        new = trainer.step(args.lr)
        t0 = time.perf_counter()
        pack = encode_delta(published, new, base_version=version - 1, version=version)
        t1 = time.perf_counter()
        report = apply_delta(sampler, pack, base_version=version - 1)
        t2 = time.perf_counter()
        ok = report.digest_verified and _same_bits(sampler, new)
        total += len(pack)
        print(f"{version:>7} {report.elements_changed / (full / 2):>7.2%} {len(pack) / 1e3:>8.1f}kB "
              f"{len(pack) / full:>8.2%} {(t1 - t0) * 1e3:>9.0f} {(t2 - t1) * 1e3:>8.0f} "
              f"{'yes' if ok else 'NO':>8}")
        if not ok:
            raise SystemExit("demo: the sampler's weights differ from the trainer's")
        published = new
    print(f"{args.steps} versions: {total / 1e6:.2f} MB on the wire instead of "
          f"{args.steps * full / 1e6:.0f} MB of full weights ({args.steps * full / total:.0f}x less); "
          "sampler bit-identical to the trainer")
    return 0
