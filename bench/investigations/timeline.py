"""One warm encode or stage call of the Qwen3-8B-shaped delta (cuda_bench.py's) on one clock:
the host's spans (the functions in SPOTS, every thread, not synchronised) and the device's
kernels and copies (torch.profiler), each as milliseconds from the call's start. A marker
kernel queued just before the call on an idle device ties the two clocks. Rows shorter than
--min-ms are left out; spans nested in another span are indented.

    python bench/investigations/timeline.py --what stage [--model qwen3-8b] [--lr 5e-7] [--min-ms 0.3] [--pinned] [--warm 2]
"""

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import weight_teleport as wt
from weight_teleport.codec import pinned_pack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: cuda_bench, versions
from cuda_bench import make_delta
from weight_teleport.codec import api
from weight_teleport.codec.cuda.encode import encoder, sparse as encode_sparse, sparse_chunks
from weight_teleport.codec.cuda.kernels import (
    chunk_table,
    class_ranks,
    encode_events,
    encode_symbols,
    stage_bitmap,
    stage_place,
    stage_symbols,
    stream_tables,
    warp,
)
from weight_teleport.codec.cuda.runtime import memory, nvcomp
from weight_teleport.codec.cuda.stage import decode_streams, sparse as stage_sparse, staging
from weight_teleport.codec.cuda.zstd_literals import gpu_writer
from weight_teleport.format import container

SPOTS = {
    "stage": [
        (api, "read_header"),
        (api, "_lives"),
        (staging, "_batches"),
        (stage_sparse.SparseBatch, "__init__"),
        (stage_sparse.StreamsRead, "result"),
        (stage_sparse.SparseBatch, "decode"),
        (staging, "class_maps"),
        (stage_sparse.SparseBatch, "decompress"),
        (stream_tables, "read"),
        (chunk_table, "build"),
        (class_ranks, "table_counts"),
        (decode_streams, "_on_gpu"),
        (decode_streams.Upload, "bytes"),
        (decode_streams, "upload_range"),
        (nvcomp, "decompress"),
        (memory, "to_device"),
        (stage_symbols, "decode"),
        (stream_tables, "in_runs"),
        (decode_streams, "_plan"),
        (nvcomp, "_buckets"),
        (memory.PinnedRing, "send"),
        (memory, "fill"),
        (stage_bitmap, "prefix"),
        (stage_place, "decode"),
        (staging, "_device_crcs"),
        (staging, "_patch"),
        (staging, "word_sums"),
        (staging, "_read_back"),
        (decode_streams, "_layout"),
        (decode_streams, "planned"),
        (stage_sparse, "_walk"),
        (nvcomp, "plan_decompress"),
        (staging, "_fused_group"),
    ],
    "encode": [
        (encoder, "_launch_scan"),
        (encoder, "_scans"),
        (encode_sparse, "merge"),
        (encoder, "_plans"),
        (encoder, "_records"),
        (encoder, "plan_table"),
        (encode_sparse, "events"),
        (encode_sparse, "encode"),
        (encode_sparse, "_class_tables"),
        (chunk_table, "build"),
        (chunk_table, "pair"),
        (warp, "hist_counts"),
        (class_ranks, "table_bases"),
        (encode_events, "events"),
        (encode_symbols, "encode"),
        (sparse_chunks, "code"),
        (gpu_writer, "plan"),
        (gpu_writer, "frame_sizes"),
        (gpu_writer, "write"),
        (sparse_chunks, "assemble"),
        (stream_tables.Tables, "lengths"),
        (stream_tables.Tables, "write"),
        (sparse_chunks, "gather"),
        (sparse_chunks, "_side_crcs"),
        (sparse_chunks, "_to_host"),
        (encoder, "_tensor_parts"),
        (api, "_items"),
        (container, "_prefix"),
        (memory, "to_device"),
        (memory, "upload"),
        (encoder, "_lay_out"),
        (api, "write_pack"),
        (container, "_header_json"),
        (container, "join"),
    ],
}
"""(owner, function name) of the host spans traced for each call."""


class Spans:
    """Wraps functions to record (start, end, depth, thread, name) of each call."""

    def __init__(self, spots):
        self.rows, self._local, self._saved = [], threading.local(), []
        for owner, name in spots:
            fn = getattr(owner, name)
            self._saved.append((owner, name, fn))
            setattr(owner, name, self._wrap(fn, f"{getattr(owner, '__name__', '?').split('.')[-1]}.{name}"))

    def _wrap(self, fn, label):
        def run(*args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.depth = depth
                self.rows.append((t0, time.perf_counter(), depth, threading.get_ident(), label))

        return run

    def restore(self) -> None:
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)


def timeline(call, spots, min_ms: float, host_only: bool = False, warm: int = 2) -> list[str]:
    """The rows of one profiled call of `call` (after `warm` ones); with `host_only` the
    host's spans alone, without the profiler (whose tracing slows every launch)."""
    for _ in range(warm):
        call()
    spans = Spans(spots)
    mark = torch.empty(1, device="cuda")
    try:
        with contextlib.nullcontext() if host_only else profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda.synchronize()
            spans.rows.clear()
            t0 = time.perf_counter()
            mark.fill_(1)
            call()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
    finally:
        spans.restore()
    dev = (
        []
        if host_only
        else sorted(
            (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
            key=lambda e: e.time_range.start,
        )
    )
    z = dev[0].time_range.start if dev else 0  # the marker
    threads = {threading.get_ident(): "main"}
    rows = [
        ((a - t0) * 1e3, (b - t0) * 1e3, f"{threads.setdefault(tid, f'thread {len(threads)}'):<9} {'  ' * d}{name}")
        for a, b, d, tid, name in sorted(spans.rows)
    ]
    rows += [
        ((e.time_range.start - z) / 1e3, (e.time_range.end - z) / 1e3, f"{'device':<9} {e.name[:60]}") for e in dev[1:]
    ]
    busy = sum(e.time_range.elapsed_us() for e in dev[1:]) / 1e3
    device = "the host's spans only" if host_only else f"device busy {busy:.1f} ms"
    out = [
        f"one call: {wall:.1f} ms, {device}; ms from the call's start",
        f"{'start':>7} {'end':>7} {'ms':>6}  where      what",
    ]
    out += [f"{a:7.1f} {b:7.1f} {b - a:6.1f}  {what}" for a, b, what in sorted(rows) if b - a >= min_ms]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=sorted(SPOTS), default="stage")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--lr", type=float, default=5e-7)
    ap.add_argument("--min-ms", type=float, default=0.3)
    ap.add_argument("--host-only", action="store_true", help="the host's spans alone, without the profiler")
    ap.add_argument("--warm", type=int, default=2, help="calls before the one timed")
    ap.add_argument(
        "--pinned", action="store_true", help="stage a pack held in pinned host memory; encode one into pinned memory"
    )
    args = ap.parse_args()
    old, new = make_delta(args.model, args.lr)
    if args.what == "encode":
        call = lambda: wt.encode_delta(old, new, base_version=0, version=1, pinned=args.pinned)
    else:
        pack = wt.encode_delta(old, new, base_version=0, version=1)
        del new
        if args.pinned:
            pack = pinned_pack(pack)
        state = {k: v.clone() for k, v in old.items()}
        call = lambda: wt.stage_delta(state, pack)
    print("\n".join(timeline(call, SPOTS[args.what], args.min_ms, args.host_only, args.warm)))


if __name__ == "__main__":
    main()
