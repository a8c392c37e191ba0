"""Where the bits go on real steps: a pack's parts against adaptive context models.

    python bench/investigations/where_bits.py [--cache-dir out/bench-real] [--lrs 1e-6 3e-6 1e-5]
        [--steps 2] [--structure]

Reads the real-data benchmark's cached versions (`weight-teleport bench --data real` makes
them; other `--steps` train and cache their own), takes each run's last step (the step
before it is the "previous change"), and prints bits per changed element of: the default
pack by part, and the adaptive code lengths of `weight_teleport.bench.bits.context_costs`.
`--structure` adds those of `weight_teleport.bench.row_bits.structure_costs` (row, column
and history contexts, all earlier steps of the run as history), each mask model with its
ratio to the order-0 bound (with the `key` residuals), and the cheapest mask and residual
models together.
"""

import argparse
import json

from weight_teleport.bench.bits import STREAM_KINDS, context_costs, pack_breakdown
from weight_teleport.bench.entropy import delta_entropy
from weight_teleport.bench.real import RealConfig, real_runs
from weight_teleport.bench.row_bits import structure_costs
from weight_teleport.codec import encode_delta


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("--cache-dir", default="out/bench-real")
    cli.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 3e-6, 1e-5])
    cli.add_argument("--losses", nargs="+", default=["ntl"])
    cli.add_argument("--steps", type=int, default=RealConfig.steps)
    cli.add_argument("--structure", action="store_true")
    args = cli.parse_args()
    cfg = RealConfig(lrs=tuple(args.lrs), losses=tuple(args.losses), steps=args.steps)
    rows = []
    for lr, loss, pairs in real_runs(cfg, args.cache_dir):
        versions = _versions(pairs)
        prev, old, new = versions[-3:]
        e = delta_entropy(old, new)
        n = e.changed
        pack = encode_delta(old, new, base_version=0, version=1)
        parts = {k: 8 * v / n for k, v in pack_breakdown(pack).items() if not k.endswith("streams")}
        costs = {k: v / n for k, v in context_costs(prev, old, new).items()}
        row = {
            "lr": lr,
            "loss": loss,
            "density": e.density,
            "bound": e.bound_bits_per_element / e.density,
            "pack": 8 * len(pack) / n,
            "parts": parts,
            "contexts": costs,
        }
        rows.append(row)
        print(
            f"lr {lr:g} {loss}: density {e.density:.3%}; bits per changed element: order-0 bound "
            f"{row['bound']:.2f}, pack {row['pack']:.2f}"
        )
        for k in ["header", "chunk tables", "dense chunks", *STREAM_KINDS]:
            h0 = f" (order-0 of raw bytes {parts[k + ' h0']:.2f})" if k in STREAM_KINDS else ""
            print(f"  {k:<18}{parts[k]:6.2f}{h0}")
        for k, v in costs.items():
            print(f"  {k:<18}{v:6.2f}")
        if args.structure:
            earlier = versions[:-2]
            row["structure"] = {k: v / n for k, v in structure_costs(earlier, old, new).items()}
            _print_structure(row["structure"], row["bound"], len(earlier))
    print(json.dumps(rows))


def _versions(pairs) -> list:
    """The run's versions, oldest first, from its (old, new) pairs."""
    versions = []
    for old, new in pairs:
        versions.append(old)
    return [*versions, new]


def _print_structure(costs: dict[str, float], bound: float, history: int) -> None:
    print(f"  structure models ({history} earlier versions), bits per change and ratio to the bound:")
    for k, v in costs.items():
        ratio = f"  {(v + costs['res:key']) / bound:.3f}x" if k.startswith("mask:") else ""
        print(f"    {k:<44}{v:6.2f}{ratio}")
    mask = min((k for k in costs if k.startswith("mask:")), key=costs.get)
    res = min((k for k in costs if k.startswith("res:")), key=costs.get)
    print(f"    {mask} + {res}: {(costs[mask] + costs[res]) / bound:.3f}x")


if __name__ == "__main__":
    main()
