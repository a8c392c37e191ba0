"""A warp kernel of another version of warp.cu against this one's, inside real encode or stage
calls of the Qwen3-8B-shaped delta (cuda_bench.py's), on one GPU. Each launch of the kernel
first launches the other version's, compiled by NVRTC with the same defines, on the same
inputs into poisoned copies of the outputs, then this version's; CUDA events time both, and
their outputs are compared byte for byte. A kernel timed on inputs captured after its call
returned reads buffers the call's next steps have reused: inside the call they are the
call's own.

    python bench/investigations/kernel_ab.py OTHER [--kernel place_lanes] [--what stage] [--calls 6]

OTHER: a git revision of this repository or a directory holding a `weight_teleport` package,
as for versions.py. Run on the H200 for `place_lanes` in stage calls (BENCHMARKS.md, twenty-
fourth round); `--what encode` has not yet run on a GPU.
"""

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

import torch

import weight_teleport as wt
from weight_teleport.codec import pinned_pack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: cuda_bench, versions
from cuda_bench import make_delta
from versions import ROOT
from weight_teleport.codec.cuda.kernels import warp
from weight_teleport.codec.cuda.runtime import nvrtc, params

OUTPUTS = {
    "class_counts": ("counts", "old_sums"),
    "hist_counts": ("counts", "events"),
    "class_events": ("ranks_out", "res_out"),
    "place_lanes": ("pos", "val", "sums"),
}
"""The output parameters of each kernel launched through `warp.launch`."""
CALLS = {"stage": ("class_counts", "place_lanes"), "encode": ("hist_counts", "class_events")}
"""The kernels each call launches through `warp.launch`."""


def parameters(source: str, kernel: str) -> list[str]:
    """The declarations of `kernel`'s parameters in `source`, such as "int* pos": of the
    fields of its parameter struct where it takes one (runtime/params.py)."""
    m = re.search(rf"\b{kernel}\s*\(([^)]*)\)\s*{{", source)
    assert m, f"no kernel {kernel} in the source"
    struct = struct_of(source, kernel)
    if struct:
        return [f"{ctype} {name}" for ctype, name in params.declared_fields(source, struct)]
    return [p.strip() for p in m.group(1).split(",")]


def struct_of(source: str, kernel: str) -> str | None:
    """The parameter struct `kernel` takes in `source`, or None where it takes a list."""
    m = re.search(rf"\b{kernel}\s*\(\s*const (\w+) prm\s*\)\s*{{", source)
    return m.group(1) if m else None


def output_indices(source: str, kernel: str) -> list[int]:
    """Where `kernel`'s output parameters (OUTPUTS) are in its parameter list in `source`."""
    names = [p.split()[-1].lstrip("*") for p in parameters(source, kernel)]
    return [names.index(n) for n in OUTPUTS[kernel]]


def other_source(version: str) -> str:
    """warp.cu of `version`: a directory holding weight_teleport, or a git revision."""
    places = ("weight_teleport/codec/cuda/kernels/warp.cu", "weight_teleport/codec/cuda/warp.cu")  # now, before
    for place in places:
        if (Path(version) / place).is_file():
            return (Path(version) / place).read_text()
    for place in places:
        shown = subprocess.run(["git", "show", f"{version}:{place}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            return shown.stdout
    raise SystemExit(f"no warp.cu in {version}")


class Pair:
    """Launches of `kernel`: the other version's, then this one's, with their events and outputs."""

    def __init__(self, kernel: str, source: str):
        self.kernel, self.source, self.modules, self.runs = kernel, source, {}, []
        self.outs = output_indices(source, kernel)
        ours = warp.SOURCE.read_text()
        assert self.outs == output_indices(ours, kernel), "the versions' outputs differ in place"
        assert struct_of(source, kernel) == struct_of(ours, kernel), "the versions take their parameters differently"
        self.launch = warp.launch

    def __call__(self, kernel, table, info, args, shared=0, unroll=None, warps=warp.WARPS, **defines):
        if kernel != self.kernel:
            return self.launch(kernel, table, info, args, shared, unroll, warps, **defines)
        key = warp._defines(info, table.block, unroll, **defines)
        other = self.modules.setdefault(key, nvrtc.Module(self.source, "warp.cu", dict(key)))
        struct = isinstance(args, params.KernelParams)
        values = list(args.values.values()) if struct else list(args)  # in the struct's field order
        ours = [values[i] for i in self.outs]
        copies = [torch.empty_like(t) for t in ours]
        for t in copies:
            t.view(torch.uint8).fill_(0xA5)
        theirs = list(values)
        for i, t in zip(self.outs, copies):
            theirs[i] = t
        if struct:  # the other version takes the same struct: same outputs in the same places
            theirs = [type(args).of(**dict(zip(args.values, theirs)))]
        else:
            theirs.append(table.programs)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        other.launch(kernel, -(-table.programs // warps), warps * 32, theirs, table.base.device, shared * warps)
        events[1].record()
        self.launch(kernel, table, info, args, shared, unroll, warps, **defines)
        events[2].record()
        self.runs.append((events, copies, ours))

    def report(self) -> str:
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for _, x, y in self.runs for a, b in zip(x, y))
        other = [e[0].elapsed_time(e[1]) for e, _, _ in self.runs][1:]  # the first compiles the other version
        this = [e[1].elapsed_time(e[2]) for e, _, _ in self.runs][1:]
        return (
            f"{self.kernel}, {len(this)} launches after the first: other version median {statistics.median(other):.3f} ms "
            f"(min {min(other):.3f}), this version median {statistics.median(this):.3f} ms (min {min(this):.3f}); "
            f"outputs byte-identical in every launch: {same}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", help="git revision or directory holding weight_teleport/")
    ap.add_argument("--kernel", default="place_lanes", choices=sorted(OUTPUTS))
    ap.add_argument("--what", default="stage", choices=sorted(CALLS), help="the call whose launches are compared")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--lr", type=float, default=5e-7)
    args = ap.parse_args()
    if args.kernel not in CALLS[args.what]:
        ap.error(f"{args.what} launches {', '.join(CALLS[args.what])}")
    old, new = make_delta("qwen3-8b", args.lr)
    pack = pinned_pack(wt.encode_delta(old, new, base_version=0, version=1))
    pair = Pair(args.kernel, other_source(args.other))
    warp.launch = pair
    try:
        for _ in range(args.calls + 1):
            if args.what == "stage":
                wt.stage_delta(old, pack)
            else:
                wt.encode_delta(old, new, base_version=0, version=1, pinned=True)
    finally:
        warp.launch = pair.launch
    print(pair.report())


if __name__ == "__main__":
    main()
