"""Where the bits go on real steps: a pack's parts against adaptive context models.

    python bench/investigations/where_bits.py [--cache-dir out/bench-real] [--lrs 1e-6 3e-6 1e-5]

Reads the real-data benchmark's cached versions (`weight-teleport bench --data real` makes
them), takes each run's last step (the step before it is the "previous change"), and prints
bits per changed element of: the default pack by part, and the adaptive code lengths of
`weight_teleport.bench.bits.context_costs`.
"""

import argparse
import json

from weight_teleport.bench.bits import STREAM_KINDS, context_costs, pack_breakdown
from weight_teleport.bench.entropy import delta_entropy
from weight_teleport.bench.real import RealConfig, real_runs
from weight_teleport.codec import encode_delta


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("--cache-dir", default="out/bench-real")
    cli.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 3e-6, 1e-5])
    cli.add_argument("--losses", nargs="+", default=["ntl"])
    args = cli.parse_args()
    cfg = RealConfig(lrs=tuple(args.lrs), losses=tuple(args.losses))
    rows = []
    for lr, loss, pairs in real_runs(cfg, args.cache_dir):
        pairs = list(pairs)
        (prev, _), (old, new) = pairs[-2], pairs[-1]
        e = delta_entropy(old, new)
        n = e.changed
        pack = encode_delta(old, new, base_version=0, version=1)
        parts = {k: 8 * v / n for k, v in pack_breakdown(pack).items() if not k.endswith("streams")}
        costs = {k: v / n for k, v in context_costs(prev, old, new).items()}
        row = {"lr": lr, "loss": loss, "density": e.density, "bound": e.bound_bits_per_element / e.density,
               "pack": 8 * len(pack) / n, "parts": parts, "contexts": costs}
        rows.append(row)
        print(f"lr {lr:g} {loss}: density {e.density:.3%}; bits per changed element: order-0 bound "
              f"{row['bound']:.2f}, pack {row['pack']:.2f}")
        for k in ["header", "chunk tables", "dense chunks", *STREAM_KINDS]:
            h0 = f" (order-0 of raw bytes {parts[k + ' h0']:.2f})" if k in STREAM_KINDS else ""
            print(f"  {k:<18}{parts[k]:6.2f}{h0}")
        for k, v in costs.items():
            print(f"  {k:<18}{v:6.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
