"""Codec `sparse_ac` on the GPU against `sparse`, and the per-record choice `auto`: each
one's pack of the same delta, encoded by the CUDA encoder and staged onto the same CUDA
weights (one device run).

The delta is `cuda_bench.make_delta`'s (a Qwen3-8B-shaped bf16 state, new = bf16(master -
lr * u)) at each learning rate. Per codec: the pack's bytes, `encode_delta` and
`stage_delta` wall times (medians of repeats after a warm-up, the device synchronised) and
whether stage + apply is bit-exact; the `auto` pack (records of both codecs) is also encoded
by the CPU backend, which must pick the same codec for every record (the bytes differ where
the GPU writes its own Huffman frames of the `sparse` streams).

    python bench/cuda_adaptive.py [--model qwen3-8b] [--lr 5e-8 5e-7] [--out DIR]
"""

import argparse
import json
import time
from pathlib import Path

import torch

import weight_teleport as wt
from cuda_bench import make_delta, wall_s
from weight_teleport.format import read_header


def _exact(state: dict, new: dict) -> bool:
    return all(torch.equal(state[k].view(torch.int16), new[k].view(torch.int16)) for k in new)


def _choices(pack) -> dict[str, str]:
    return {t.name: t.codec for t in read_header(pack).tensors}


def run(model: str, lr: float, repeats: int) -> dict:
    old, new = make_delta(model, lr)
    n = sum(t.numel() for t in old.values())
    changed = sum(int((old[k].view(torch.int16) != new[k].view(torch.int16)).sum()) for k in old)
    row = {"lr": lr, "elements": n, "density": changed / n, "packs": {}}
    for codec in ("sparse", "sparse_ac", "auto"):
        enc_s, pack = wall_s(lambda: bytes(wt.encode_delta(old, new, base_version=0, version=1, codec=codec)), repeats)
        state = {k: v.clone() for k, v in old.items()}
        stage_s, staged = wall_s(lambda: wt.stage_delta(state, pack), repeats)
        wt.apply_staged(state, staged)
        row["packs"][codec] = {
            "bytes": len(pack),
            "encode_ms": enc_s * 1e3,
            "stage_ms": stage_s * 1e3,
            "stage_gbps": 2 * n / stage_s / 1e9,
            "bit_exact": _exact(state, new),
        }
        state = staged = None  # their device memory, freed before the next codec
        torch.cuda.empty_cache()
    old_c = {k: v.cpu() for k, v in old.items()}
    new_c = {k: v.cpu() for k, v in new.items()}
    t0 = time.perf_counter()
    cpu_pack = wt.encode_delta(old_c, new_c, base_version=0, version=1, codec="auto")
    row["cpu_encode_s"] = time.perf_counter() - t0
    row["cpu_same_choice"] = _choices(cpu_pack) == _choices(pack)
    del old_c, new_c, cpu_pack
    old = new = None
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--lr", type=float, nargs="+", default=[5e-8, 5e-7])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows = [run(args.model, lr, args.repeats) for lr in args.lr]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "cuda_adaptive.json").write_text(json.dumps(rows, indent=1))
    print(f"{'lr':>6} {'density':>8} {'codec':<9} {'bytes':>12} {'encode ms':>10} {'stage ms':>9} {'GB/s':>7} exact")
    for r in rows:
        for name, p in r["packs"].items():
            print(
                f"{r['lr']:>6g} {r['density']:>8.3%} {name:<9} {p['bytes']:>12,} {p['encode_ms']:>10.1f} "
                f"{p['stage_ms']:>9.1f} {p['stage_gbps']:>7.1f} {p['bit_exact']}"
            )
        print(f"       the CPU's auto pack ({r['cpu_encode_s']:.1f} s) picks the same codecs: {r['cpu_same_choice']}")


if __name__ == "__main__":
    main()
