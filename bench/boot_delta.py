"""How big a catch-up delta from the boot checkpoint is, against an anchor: a sampler that
booted from checkpoint C (the weights the run began from) and joins at version V could fetch
one delta C -> V instead of V's anchor (#60's catch-up from the boot checkpoint).

Real steps of the real-step benchmark's model and corpus (`weight_teleport.bench.real`:
SmolLM2-135M fine-tuned on CPython's documentation, AdamW, next-token loss), from the
fine-tuned weights C, at each learning rate; at the steps listed, the bytes of
`encode_delta(C, V)` (each codec), of V's anchor (`encode_snapshot`), of the step's own
delta (V-1 -> V), and the share of elements that differ from C. Every C -> V delta is
checked bit-exact. The last column extrapolates the share changed to 1000 steps from a
power law fit to the measured steps (said as such).

    python bench/boot_delta.py [--lrs 1e-6 1e-5] [--steps 100] [--at 1 10 30 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from weight_teleport.bench import real
from weight_teleport.bench import real_train as T
from weight_teleport.codec import apply_delta, encode_delta, encode_snapshot


def changed_share(a: dict, b: dict) -> float:
    n = sum(t.numel() for t in a.values())
    return sum(int((a[k].view(torch.int16) != b[k].view(torch.int16)).sum()) for k in a) / n


def sizes(boot: dict, prev: dict, now: dict, threads: int) -> dict:
    out = {"changed": changed_share(boot, now)}
    for codec in ("sparse", "sparse_ac"):
        pack = encode_delta(boot, now, base_version=0, version=1, codec=codec, threads=threads)
        state = {k: t.clone() for k, t in boot.items()}
        apply_delta(state, pack, threads=threads)
        assert all(torch.equal(state[k].view(torch.int16), now[k].view(torch.int16)) for k in now), "not bit-exact"
        out[f"boot_{codec}"] = len(pack)
        out[f"step_{codec}"] = len(encode_delta(prev, now, base_version=0, version=1, codec=codec, threads=threads))
    out["anchor"] = len(encode_snapshot(now, version=1, threads=threads))
    return out


def run(lr: float, steps: int, at: set[int], threads: int, cache: Path) -> list[dict]:
    from weight_teleport.bench import gguf_model

    cfg = real.RealConfig(lrs=(lr,), losses=("ntl",))
    path = real.default_model()
    torch.manual_seed(cfg.seed)
    model, _, opt_state, tokens = real._finetuned(
        cfg, path, cache / real._key(cfg, path, real._PROCEDURE), gguf_model.load(path)
    )
    opt = T.make_optimizer(model, lr)
    opt.load_state_dict(opt_state)
    for group in opt.param_groups:
        group["lr"] = lr
    boot = prev = T.published(model)
    rows = []
    model.train()
    t0 = time.time()
    for s in range(1, steps + 1):
        batch = T.windows(tokens, cfg.finetune_steps + s, cfg.train.batch, cfg.train.seq)
        T.step(model, opt, T.ntl_loss(model, batch))
        now = T.published(model)
        if s in at:
            rows.append({"lr": lr, "step": s, **sizes(boot, prev, now, threads), "elapsed_s": time.time() - t0})
            print(json.dumps(rows[-1]), flush=True)
        prev = now
    return rows


def fit_share(rows: list[dict], at: int) -> float:
    """The share changed at step `at`, from a power law through the rows' steps >= 10."""
    pts = [(math.log(r["step"]), math.log(r["changed"])) for r in rows if r["step"] >= 10 and r["changed"] > 0]
    if len(pts) < 2:
        return float("nan")
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    slope = (y1 - y0) / (x1 - x0)
    return min(1.0, math.exp(y1 + slope * (math.log(at) - x1)))


def table(rows: list[dict]) -> str:
    lines = [
        "| lr | step | changed since C | C -> V, sparse / sparse_ac | anchor | C -> V / anchor (sparse_ac) | the step's own delta (sparse_ac) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['lr']:g} | {r['step']} | {r['changed']:.3%} | {r['boot_sparse'] / 1e6:.2f} / {r['boot_sparse_ac'] / 1e6:.2f} MB "
            f"| {r['anchor'] / 1e6:.1f} MB | {r['boot_sparse_ac'] / r['anchor']:.3f} | {r['step_sparse_ac'] / 1e6:.3f} MB |"
        )
    for lr in sorted({r["lr"] for r in rows}):
        mine = [r for r in rows if r["lr"] == lr]
        lines.append(
            f"lr {lr:g}: share changed since C at step 1000, extrapolated (power law, steps 10..): {fit_share(mine, 1000):.2%}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--at", type=int, nargs="+", default=[1, 10, 30, 100])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default="out/bench-real")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r for lr in args.lrs for r in run(lr, args.steps, set(args.at), args.threads, Path(args.cache_dir))]
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
