"""Block / row / warp shapes of the CUDA rank kernels on the Qwen3-8B-shaped delta (one
device run): per-kernel device times (torch.profiler) of one encode and one stage per shape,
packs compared byte for byte with the first shape's, stage + apply compared bit for bit with
the new weights. Each shape (block; rows of both rank kernels; warps of them and of the
class-count kernel) is set on the modules before its calls.

    python bench/cuda_shapes.py
"""

import torch
from torch.profiler import ProfilerActivity, profile

import weight_teleport as wt
from cuda_bench import make_delta
from weight_teleport.codec.cuda import ranks, sparse_decode, sparse_encode

KERNELS = ("_events_kernel", "_table_counts_kernel", "_decode_kernel", "_bases_kernel")
SHAPES = ((2048, 16, 4), (1024, 16, 4), (1024, 8, 4), (2048, 8, 4), (512, 16, 4), (1024, 16, 2))
"""(block, rows, warps) tried, the first the reference for the packs."""


def set_shape(block: int, row: int, warps: int) -> None:
    ranks.BLOCK, ranks.NUM_WARPS = block, warps
    sparse_encode.ROW = sparse_decode.ROW = row
    sparse_encode.NUM_WARPS = sparse_decode.NUM_WARPS = warps


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
    times = {e.key: e.device_time_total / 1e3 for e in prof.key_averages() if e.key in KERNELS}
    return pack if again == pack else None, exact, times


def main() -> None:
    old, new = make_delta("qwen3-8b", 5e-7)
    ref, rows = None, []
    for shape in SHAPES:
        set_shape(*shape)
        pack, exact, times = run_shape(old, new)
        ref = ref or pack
        rows.append((*shape, pack is not None and pack == ref, exact, times))
        print(rows[-1], flush=True)
    print(f"{'block':>6} {'row':>4} {'warps':>5} {'same pack':>9} {'exact':>5} " + " ".join(f"{k:>22}" for k in KERNELS))
    for b, r, w, same, ok, t in rows:
        print(f"{b:>6} {r:>4} {w:>5} {str(same):>9} {str(ok):>5} " + " ".join(f"{t.get(k, 0):>19.2f} ms" for k in KERNELS))


if __name__ == "__main__":
    main()
