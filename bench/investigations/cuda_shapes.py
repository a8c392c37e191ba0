"""The CUDA backend's per-element kernels on the Qwen3-8B-shaped delta (one device run):
the CUDA C warp kernels (codec/cuda/kernels/warp.cu) against the Triton kernels in block / row /
warp shapes, as per-kernel device times (torch.profiler) of one encode and one stage each, packs compared
byte for byte with the warp kernels', stage + apply compared bit for bit with the new
weights. Each Triton shape (block; rows of both rank kernels; warps of them and of the
class-count kernel) is set on the modules before its calls.

    python bench/investigations/cuda_shapes.py [--all-shapes]
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import weight_teleport as wt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: cuda_bench, versions
from cuda_bench import make_delta
from weight_teleport.codec.cuda.kernels import class_ranks, encode_events, stage_place, warp

KERNELS = {
    "scan": ("scan_words", "_scan_kernel"),
    "counts": ("class_counts", "hist_counts", "_table_counts_kernel"),
    "events": ("class_events", "_events_kernel"),
    "placement": ("place_lanes", "_decode_kernel"),
    "block starts": ("_block_changes_kernel",),
    "bases": ("_bases_kernel",),
}
"""Columns: the kernels (warp or Triton) that do each step."""
SHAPES = ((2048, 16, 4), (1024, 16, 4), (1024, 8, 4), (2048, 8, 4), (512, 16, 4), (1024, 16, 2))
"""(block, rows, warps) of the Triton kernels tried with --all-shapes."""


def set_shape(block: int, row: int, warps: int) -> None:
    class_ranks.BLOCK, class_ranks.NUM_WARPS = block, warps
    encode_events.ROW = stage_place.ROW = row
    encode_events.NUM_WARPS = stage_place.NUM_WARPS = warps


def run_shape(old, new):
    """(pack, stage + apply bit-exact, per-kernel device ms of one more encode and stage)."""
    state = {k: v.clone() for k, v in old.items()}
    pack = wt.encode_delta(old, new, base_version=0, version=1)
    wt.apply_staged(state, wt.stage_delta(state, pack))  # also compiles the kernels
    exact = all(torch.equal(state[k].view(torch.int16), new[k].view(torch.int16)) for k in new)
    state = {k: v.clone() for k, v in old.items()}
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        again = wt.encode_delta(old, new, base_version=0, version=1)
        wt.stage_delta(state, again)
        torch.cuda.synchronize()
    ms = {e.key: e.device_time_total / 1e3 for e in prof.key_averages()}
    times = {col: sum(ms.get(k, 0.0) for k in names) for col, names in KERNELS.items()}
    return pack if again == pack else None, exact, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all-shapes", action="store_true", help="every Triton shape, not only the configured one")
    args = ap.parse_args()
    old, new = make_delta("qwen3-8b", 5e-7)
    configured = (class_ranks.BLOCK, encode_events.ROW, encode_events.NUM_WARPS)
    variants = [("warp", None), ("triton", None)] + [("triton", s) for s in SHAPES if args.all_shapes]
    ref, rows = None, []
    for kind, shape in variants:
        warp.enabled = kind == "warp"
        if shape:
            set_shape(*shape)
        pack, exact, times = run_shape(old, new)
        ref = ref or pack
        name = kind if shape is None else f"{kind} {shape[0]} x {shape[1]}, {shape[2]} warps"
        rows.append((name, pack is not None and pack == ref, exact, times))
        print(rows[-1], flush=True)
    print(
        f"configured Triton shapes: block {configured[0]}, events rows {configured[1]} / {configured[2]} warps, "
        f"placement rows {stage_place.ROW} / {stage_place.NUM_WARPS} warps"
    )
    print(f"{'kernels':>28} {'same pack':>9} {'exact':>5} " + " ".join(f"{k:>12}" for k in KERNELS))
    for name, same, ok, t in rows:
        print(f"{name:>28} {str(same):>9} {str(ok):>5} " + " ".join(f"{t[k]:>9.2f} ms" for k in KERNELS))


if __name__ == "__main__":
    main()
