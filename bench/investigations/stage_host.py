"""The host's work of a CUDA stage call that needs no GPU, timed on the CPU: up to the
decompression's launch, and the digest checks after the read-back (on word sums that pass
them). On a pack with the Qwen3-8B-shaped delta's structure (its 399 tensors and about 1,950
sparse chunks: every tensor has 1/SCALE of its rows and a chunk 2^22/SCALE elements), so
that this path can be worked on without a GPU. Medians of repeats, in ms.

    python bench/investigations/stage_host.py [--scale 32] [--repeats 50] [--lr 5e-7]
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import weight_teleport as wt
from weight_teleport.bench.simulate import UNCALIBRATED, _generator, _init_tensor, make_config, tensor_shapes
from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.stage import sparse, staging
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.codec.plan import class_maps, run_arrays
from weight_teleport.format import read_header
from weight_teleport.format.container import ChunkSpans


def structured_pack(scale: int, lr: float) -> bytes:
    """A delta of the Qwen3-8B-shaped state at 1/scale of its rows, chunks of 2^22/scale."""
    old, new = {}, {}
    noise = torch.Generator().manual_seed(0)
    for name, shape in tensor_shapes(make_config("qwen3-8b")).items():
        shape = (max(shape[0] // scale, 8), *shape[1:])
        w = _init_tensor(name, shape, _generator(torch.device("cpu"), 0, "init", name), UNCALIBRATED)
        old[name] = w.to(torch.bfloat16)
        new[name] = (w - lr * torch.randn(w.shape, generator=noise)).to(torch.bfloat16)
    return wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=(1 << 22) // scale)


def passing_sums(rec, nbytes: int) -> tuple[int, int]:
    """Word sums (old, new) that pass `rec`'s digest checks."""
    return D.word_sum(D.from_hex(rec.base_digest), nbytes), D.word_sum(D.from_hex(rec.digest), nbytes)


def record_at_a_time(recs, nbytes, sums, header) -> None:
    """The digest checks as the stage made them before `stage._digest_failures`."""
    for rec, n, (s_old, _) in zip(recs, nbytes.tolist(), sums.tolist()):
        staging._check_base(rec, n, s_old, header)
    for rec, n, (s_old, s_new) in zip(recs, nbytes.tolist(), sums.tolist()):
        staging._check_result(rec, n, s_old, s_new)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        memory.begin_call()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--lr", type=float, default=5e-7)
    args = ap.parse_args()
    pack = structured_pack(args.scale, args.lr)
    header = read_header(pack)
    recs = [r for r in header.tensors if r.codec == "sparse"]
    info = BY_NAME[recs[0].dtype]
    spans = ChunkSpans.of(header, recs)
    runs = run_arrays([r.classes for r in recs])
    n_classes = runs.top_classes() + 1
    pool = ThreadPoolExecutor(1)
    checked = [r for r in header.tensors if r.codec in ("sparse", "same")]
    nbytes = np.array([r.numel * BY_NAME[r.dtype].nbytes for r in checked], np.uint64)
    sums = np.array([passing_sums(r, int(n)) for r, n in zip(checked, nbytes)], np.uint64).view(np.int64)
    digests = staging._record_digests(checked)
    rows = {
        "read_header": lambda: read_header(pack),
        "ChunkSpans.of": lambda: ChunkSpans.of(header, recs),
        "class-map runs as arrays and their classes (plan.run_arrays)": lambda: run_arrays(
            [r.classes for r in recs]
        ).top_classes(),
        "class maps from those arrays (plan.class_maps)": lambda: class_maps(recs, info, runs),
        "the stream tables' walk on a helper, waited for (StreamsRead)": lambda: sparse.StreamsRead(
            pack, spans, recs, n_classes, *spans.bounds(), pool
        ).done.result(),
        "the same, then its checks and layout (StreamsRead.result)": lambda: sparse.StreamsRead(
            pack, spans, recs, n_classes, *spans.bounds(), pool
        ).result("cpu"),
        "digest checks after the read-back, a record at a time": lambda: record_at_a_time(
            checked, nbytes, sums, header
        ),
        "the same over all records at once (stage._digest_failures)": lambda: staging._digest_failures(
            checked, nbytes, sums
        ),
        "the records' sizes and digests, which the stage now reads before the read-back": lambda: (
            np.array([r.numel * BY_NAME[r.dtype].nbytes for r in checked], np.uint64),
            staging._record_digests(checked),
        ),
        "the checks on those, after the read-back": lambda: staging._digest_failures(checked, nbytes, sums, digests),
    }
    print(
        f"pack {len(pack):,} bytes, {len(header.tensors)} tensors, {len(recs)} sparse, "
        f"{spans.starts.size} sparse chunks (scale 1/{args.scale}); medians of {args.repeats}, ms"
    )
    for name, fn in rows.items():
        print(f"{median_ms(fn, args.repeats):8.3f}  {name}")


if __name__ == "__main__":
    main()
