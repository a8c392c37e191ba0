"""The simulator's change statistics beside real steps' at the same learning rates.

    python bench/calibrate_sim.py [--cache-dir out/bench-real] [--layers 3] [--uncalibrated]

Per learning rate and step, the share of changed bf16 elements of matrices, of the embedding
and of RMSNorm weights, and the share of one-ULP moves among the changes: first of the real
steps (`weight-teleport bench --data real` trains and caches them; next-token loss), then of
the simulator (`weight_teleport.bench.simulate`, calibration `REAL_STEPS`) on a decoder of
SmolLM2-135M's widths cut to `--layers` layers. `REAL_STEPS` was chosen by reading this.
"""

import argparse

from weight_teleport.bench import simulate as S
from weight_teleport.bench.entropy import bit_view, order_keys
from weight_teleport.bench.real import RealConfig, real_runs

LRS = (1e-6, 3e-6, 1e-5)


def _kind(name: str) -> str:
    if "norm" in name:
        return "norm"
    return "embed" if "embed" in name else "matrix"


def change_stats(old: S.State, new: S.State) -> dict[str, tuple[float, float]]:
    """Per tensor kind: (changed share, one-ULP share of the changes)."""
    agg: dict[str, list[int]] = {}
    for name, t in old.items():
        d = order_keys(bit_view(new[name])) - order_keys(bit_view(t))
        a = agg.setdefault(_kind(name), [0, 0, 0])
        a[0] += t.numel()
        a[1] += int((d != 0).sum())
        a[2] += int((d.abs() == 1).sum())
    return {k: (c / n, one / max(c, 1)) for k, (n, c, one) in sorted(agg.items())}


def _print(source: str, lr: float, step: int, stats: dict) -> None:
    cells = "  ".join(f"{k} {c:.3%} (1 ULP {one:.3f})" for k, (c, one) in stats.items())
    print(f"{source:<5} lr {lr:g} step {step}: {cells}", flush=True)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--cache-dir", default="out/bench-real")
    cli.add_argument("--layers", type=int, default=3)
    cli.add_argument("--uncalibrated", action="store_true", help="simulate with UNCALIBRATED instead")
    args = cli.parse_args()
    for lr, _, pairs in real_runs(RealConfig(lrs=LRS, losses=("ntl",)), args.cache_dir):
        for step, (old, new) in enumerate(pairs):
            _print("real", lr, step, change_stats(old, new))
    cal = S.UNCALIBRATED if args.uncalibrated else S.REAL_STEPS
    config = S.ModelConfig("smollm2-widths", 576, 1536, args.layers, 9, 3, 64, 8192)
    initial = S.make_state(config, 0, calibration=cal)
    for lr in LRS:
        master = {n: w.clone() for n, w in initial.items()}
        for step, (old, new) in enumerate(S.delta_pairs(master, lr, 2, 0, calibration=cal)):
            _print("sim", lr, step, change_stats(old, new))


if __name__ == "__main__":
    main()
