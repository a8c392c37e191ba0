"""Pack headers and the garbage collector: `write_pack` and `read_header` of a header shaped
like the Qwen3-8B delta's (399 tensors, 9330 chunks) in a process holding torch, numba and
triton, with the collector paused around the header's JSON (as the container does) and
without (the pause replaced by a no-op), alternated in one process. Prints per-call medians
and maxima and the full collections that landed inside the calls.

    python bench/investigations/header_gc.py [--calls 60]
"""

import argparse
import contextlib
import gc
import time

import numba  # noqa: F401  (a real process's long-lived objects)
import numpy as np
import torch  # noqa: F401
import triton  # noqa: F401

from weight_teleport.format import container
from weight_teleport.format.container import ChunkRef, PackHeader, TensorRecord, read_header, write_pack


def qwen3_8b_like_header(seed: int = 0) -> PackHeader:
    """279 sparse tensors holding 9330 chunks between them, 120 unchanged ones."""
    rng = np.random.default_rng(seed)
    recs, off = [], 0
    for i, part in enumerate(np.array_split(np.arange(9330), 279) + [[]] * 120):
        chunks = []
        for _ in part:
            n = int(rng.integers(5000, 40000))
            chunks.append(ChunkRef(off, n, int(rng.integers(0, 2**32))))
            off += n
        recs.append(
            TensorRecord(
                name=f"model.layers.{i}.weight",
                dtype="bfloat16",
                shape=(max(len(chunks), 1) * 4096, 1024),
                codec="sparse" if chunks else "same",
                digest="0" * 16,
                base_digest="1" * 16,
                changed=len(chunks),
                classes=[(0, 0), (100, 1), (120, 2)],
                inverted=[1],
                chunks=chunks,
            )
        )
    return PackHeader("delta", 1, 0, 1 << 22, recs, ["raw", "zstd"])


def run(fn, calls: int) -> tuple[np.ndarray, int]:
    """(per-call ms, full collections that started inside a call)."""
    starts, spans = [], []
    record = lambda phase, info: (
        starts.append(time.perf_counter()) if phase == "start" and info["generation"] == 2 else None
    )
    gc.callbacks.append(record)
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            spans.append((t0, time.perf_counter()))
    finally:
        gc.callbacks.remove(record)
    inside = sum(any(a <= s <= b for a, b in spans) for s in starts)
    return np.array([(b - a) * 1e3 for a, b in spans]), inside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    header = qwen3_8b_like_header()
    last = header.tensors[278].chunks[-1]
    pack = write_pack(header, [np.zeros(last.offset + last.length, np.uint8)])  # a payload the chunks fit
    paused = container.collections_paused
    print(f"header {read_header(pack).payload_offset} bytes, {len(gc.get_objects())} objects tracked by the collector")
    print(f"{'call':12s} {'collector':10s} {'median':>8s} {'max':>8s} {'full collections inside':>24s}")
    calls = (
        ("write_pack", lambda: write_pack(header, [b""])),  # the header alone: no payload to join
        ("read_header", lambda: read_header(pack)),
    )
    for name, fn in calls:
        for mode in ("paused", "running"):
            container.collections_paused = paused if mode == "paused" else contextlib.nullcontext
            try:
                ms, inside = run(fn, args.calls)
            finally:
                container.collections_paused = paused
            print(f"{name:12s} {mode:10s} {np.median(ms):6.1f} ms {ms.max():6.1f} ms {inside:11d} of {args.calls}")


if __name__ == "__main__":
    main()
