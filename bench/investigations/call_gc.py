"""The codec's calls and the garbage collector: encode_delta and stage_delta of a
model-shaped bf16 delta, with the collector paused for each call (as codec/api.py does) and
running (the undecorated functions, the header's own pause a no-op), alternated in one
process. Prints per-call medians and maxima and the full collections that landed inside
the calls. On CUDA the Qwen3-8B-shaped state of cuda_bench.py; on the CPU a smaller model.

    python bench/investigations/call_gc.py [--calls 50] [--model qwen3-0.6b]
"""

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np
import torch

import weight_teleport as wt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: cuda_bench, versions
from cuda_bench import make_delta
from header_gc import run
from weight_teleport.format import container


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--model", default=None, help="default: qwen3-8b on CUDA, qwen3-0.6b on the CPU")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    old, new = make_delta(args.model or ("qwen3-8b" if device == "cuda" else "qwen3-0.6b"), 5e-7, device=device)
    pack = wt.encode_delta(old, new, base_version=0, version=1)
    state = {k: v.clone() for k, v in old.items()}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    calls = {"encode_delta": lambda f: f(old, new, base_version=0, version=1), "stage_delta": lambda f: f(state, pack)}
    fns = {"encode_delta": wt.encode_delta, "stage_delta": wt.stage_delta}
    paused = container.collections_paused
    print(f"{device}, {len(old)} tensors, pack {len(pack)} bytes")
    print(f"{'call':12s} {'collector':10s} {'median':>8s} {'max':>8s} {'full collections inside':>24s}")
    for name, call in calls.items():
        call(fns[name])  # first calls compile kernels and grow buffers
        sync()
        results = {"paused": [], "running": []}
        for _ in range(args.calls):  # alternated call by call
            for mode, res in results.items():
                fn = fns[name] if mode == "paused" else fns[name].__wrapped__
                container.collections_paused = paused if mode == "paused" else contextlib.nullcontext
                try:
                    res.append(run(lambda: (call(fn), sync()), 1))
                finally:
                    container.collections_paused = paused
        for mode, res in results.items():
            ms = np.concatenate([r[0] for r in res])
            inside = sum(r[1] for r in res)
            print(f"{name:12s} {mode:10s} {np.median(ms):6.1f} ms {ms.max():6.1f} ms {inside:11d} of {args.calls}")


if __name__ == "__main__":
    main()
