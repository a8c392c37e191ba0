"""CUDA codec benchmark on a Qwen3-8B-shaped set of bf16 tensors (one device run).

The delta is generated directly, not by the AdamW simulator (whose fp32 moments of an 8B
model need ~98 GB): trained-like fp32 masters from `make_state`, old = bf16(master),
new = bf16(master - lr * u) with u standard normal per element (an Adam step moves each
weight by about lr). Times are CUDA-event medians of repeats; end-to-end calls (which
include host work) are wall-clock with a device synchronisation.

    python bench/cuda_bench.py [--model qwen3-8b] [--lr 5e-7] [--out DIR]
"""

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

import weight_teleport as wt
from weight_teleport.codec import inspect, pinned_pack
from weight_teleport.bench.simulate import make_config, make_state
from weight_teleport.codec.cuda.kernels import chunk_table, class_ranks
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.kernels.digest import word_sums
from weight_teleport.codec.cuda.kernels.encode_scan import SPAN, scan
from weight_teleport.codec.dtypes import dtype_info


def cuda_ms(fn, repeats: int = 5) -> float:
    """Median milliseconds of `fn` between CUDA events, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def wall_s(fn, repeats: int = 2):
    """(median wall seconds, last result) of `fn` after one warm-up call, synchronising the
    device around it."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def make_delta(model: str, lr: float, seed: int = 0, device: str = "cuda"):
    """(old, new) bf16 states: trained-like fp32 masters, new = bf16(master - lr * u)."""
    master = make_state(make_config(model), seed, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    old, new = {}, {}
    for name in list(master):
        w = master.pop(name)
        old[name] = w.to(torch.bfloat16)
        new[name] = w.add_(torch.randn(w.shape, generator=gen, device=device), alpha=-lr).to(torch.bfloat16)
        del w
    return old, new


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 4 GiB device-to-device copy."""
    src = torch.empty(1 << 31, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src), 10)
    return 2 * src.numel() * 2 / (ms / 1e3)


def gpu_passes(old, new, chunk_elems: int = 1 << 22):
    """Median ms of the encoder's scan launch and of the stage's class-count launch (the live
    weights' elements of 16 classes per block), each one launch over every chunk of every
    tensor."""
    info = dtype_info(torch.bfloat16)
    olds = [old[k].view(torch.int16).view(-1) for k in old]
    news = [new[k].view(torch.int16).view(-1) for k in old]
    t_scan = chunk_table.build(olds, chunk_elems, SPAN)
    p_scan = chunk_table.pair(news, t_scan)
    t_count = chunk_table.build(olds, chunk_elems, class_ranks.stage_block(olds[0]))  # the stage's blocks
    lut = torch.clamp((torch.arange(256) - 100) // 2, 0, 15).to(torch.uint8)  # 16 classes
    luts = lut.repeat(len(olds), 1).cuda().contiguous()
    scan_ms = cuda_ms(lambda: scan(t_scan, p_scan, info))
    count_ms = cuda_ms(lambda: class_ranks.table_counts(t_count, luts, info, 16, 16))
    return scan_ms, count_ms


def phases(call, spots, repeats: int = 3) -> dict[str, float]:
    """Median milliseconds of each phase (function `spots` names) of `call`, the device
    synchronised around each phase (phases wrapped for these calls only), and of the call."""
    times, saved = {}, [(m, f, getattr(m, f)) for m, f in spots]

    def timed(name, fn):
        def run(*a, **kw):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            torch.cuda.synchronize()
            times[name][-1] += (time.perf_counter() - t0) * 1e3
            return out

        return run

    for m, f, fn in saved:
        setattr(m, f, timed(f, fn))
    try:
        for _ in range(repeats):
            for m, f, _ in saved:
                times.setdefault(f, []).append(0.0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times.setdefault("total", []).append((time.perf_counter() - t0) * 1e3)
    finally:
        for m, f, fn in saved:
            setattr(m, f, fn)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def encode_spots() -> list[tuple]:
    """The (owner, function name) phases `encode_phases` times."""
    from weight_teleport.codec import api
    from weight_teleport.codec.cuda.encode import encoder, sparse as encode_sparse, sparse_chunks
    from weight_teleport.codec.cuda.kernels import encode_symbols

    return [
        (encoder, "_launch_scan"),
        (encoder, "_scans"),
        (encode_sparse, "events"),
        (encode_symbols, "encode"),
        (sparse_chunks, "code"),
        (sparse_chunks, "assemble"),
        (api, "write_pack"),
    ]


def stage_spots() -> list[tuple]:
    """The (owner, function name) phases `stage_phases` times."""
    from weight_teleport.codec.cuda.kernels import stage_place
    from weight_teleport.codec.cuda.stage import decode_streams, sparse as stage_sparse, staging

    return [
        (stage_sparse.StreamsRead, "result"),
        (decode_streams, "inflate"),
        (stage_place, "decode"),
        (staging, "_read_back"),
    ]


def encode_phases(old, new) -> dict[str, float]:
    return phases(lambda: wt.encode_delta(old, new, base_version=0, version=1), encode_spots())


def stage_phases(state, pack) -> dict[str, float]:
    return phases(lambda: wt.stage_delta(state, pack), stage_spots())


def pinned_patch_apply_ms(old, pack: bytes) -> float:
    """Median ms of the pause when the staged patch waits in pinned host memory."""
    state = {k: v.clone() for k, v in old.items()}
    staged = wt.stage_delta(state, pack, device_budget=0)
    return cuda_ms(lambda: wt.apply_staged(state, staged), 5)


def profile(calls: dict, out: Path) -> None:
    """Per call, a table of its device kernels (time, launches) from torch.profiler, written
    to out/profile_<name>.txt (where the device time goes and how many launches it takes),
    and its host functions by cumulative time to out/host_<name>.txt."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for name, fn in calls.items():
        fn()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="device_time_total", row_limit=30, max_name_column_width=60)
        (out / f"profile_{name}.txt").write_text(table)
        host = cProfile.Profile()
        host.runcall(fn)
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats("cumulative").print_stats(40)
        (out / f"host_{name}.txt").write_text(text.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--lr", type=float, default=5e-7)
    ap.add_argument("--out", default=".")
    ap.add_argument("--profile", action="store_true", help="also write per-kernel tables")
    args = ap.parse_args()
    bw = copy_bandwidth()
    old, new = make_delta(args.model, args.lr)
    n = sum(t.numel() for t in old.values())
    gb = 2 * n / 1e9
    digest_ms = cuda_ms(lambda: word_sums(list(old.values())))
    scan_ms, count_ms = gpu_passes(old, new)
    enc_s, pack = wall_s(lambda: wt.encode_delta(old, new, base_version=0, version=1), 9)
    enc_pinned_s, pinned_out = wall_s(lambda: wt.encode_delta(old, new, base_version=0, version=1, pinned=True), 9)
    assert bytes(pinned_out) == pack
    nvz_s, nvz_pack = wall_s(
        lambda: wt.encode_delta(old, new, base_version=0, version=1, cuda=CudaCodecConfig(stream_coder="nvcomp-zstd")),
        5,
    )
    ans_s, ans_pack = wall_s(
        lambda: wt.encode_delta(old, new, base_version=0, version=1, cuda=CudaCodecConfig(stream_coder="nvcomp-ans")), 5
    )
    enc_phases = encode_phases(old, new)
    info = inspect(pack)
    changed = info["changed"]
    state = {k: v.clone() for k, v in old.items()}
    stage_s, staged = wall_s(lambda: wt.stage_delta(state, pack), 9)
    pinned = pinned_pack(pack)
    pinned_s, _ = wall_s(lambda: wt.stage_delta(state, pinned), 9)
    st_phases = stage_phases(state, pack)
    ans_pinned = pinned_pack(ans_pack)
    ans_state = {k: v.clone() for k, v in old.items()}  # a patch applies to the tensors it was staged on
    ans_stage_s, ans_staged = wall_s(lambda: wt.stage_delta(ans_state, ans_pinned), 5)
    wt.apply_staged(ans_state, ans_staged)
    ans_ok = all(torch.equal(ans_state[k].view(torch.int16), new[k].view(torch.int16)) for k in new)
    ans_state = ans_staged = None
    apply_ms = cuda_ms(lambda: wt.apply_staged(state, staged), 10)
    ok = all(torch.equal(state[k].view(torch.int16), new[k].view(torch.int16)) for k in new)
    host_apply_ms = pinned_patch_apply_ms(old, pack)
    subset = list(old)[:12]
    cpu_pack = wt.encode_delta(
        {k: old[k].cpu() for k in subset}, {k: new[k].cpu() for k in subset}, base_version=0, version=1
    )
    gpu_pack = wt.encode_delta({k: old[k] for k in subset}, {k: new[k] for k in subset}, base_version=0, version=1)
    cpu_zstd_gpu = wt.encode_delta(
        {k: old[k] for k in subset},
        {k: new[k] for k in subset},
        base_version=0,
        version=1,
        cuda=CudaCodecConfig(stream_coder="cpu-zstd"),
    )
    floor = lambda nbytes: nbytes / bw * 1e3
    rows = [
        ("copy bandwidth (read+write)", f"{bw / 1e12:.2f} TB/s", "", ""),
        (
            "digest of every tensor (GPU, one launch)",
            f"{gb / (digest_ms / 1e3):.0f} GB/s",
            f"{digest_ms:.2f} ms",
            f"{floor(2 * n):.2f} ms",
        ),
        ("encode scan (one launch)", f"{gb / (scan_ms / 1e3):.0f} GB/s", f"{scan_ms:.2f} ms", f"{floor(4 * n):.2f} ms"),
        (
            "stage class counts, 16 classes (one launch)",
            f"{gb / (count_ms / 1e3):.0f} GB/s",
            f"{count_ms:.2f} ms",
            f"{floor(2 * n):.2f} ms",
        ),
        (
            "encode_delta end to end (Huffman zstd frames)",
            f"{gb / enc_s:.1f} GB/s",
            f"{enc_s * 1e3:.0f} ms",
            f"{floor(4 * n):.2f} ms",
        ),
        (
            "encode_delta, pack into pinned memory",
            f"{gb / enc_pinned_s:.1f} GB/s",
            f"{enc_pinned_s * 1e3:.0f} ms",
            f"{floor(4 * n):.2f} ms",
        ),
        (
            "encode_delta end to end (nvCOMP zstd)",
            f"{gb / nvz_s:.1f} GB/s",
            f"{nvz_s * 1e3:.0f} ms",
            f"{floor(4 * n):.2f} ms",
        ),
        (
            "encode_delta end to end (nvCOMP ANS)",
            f"{gb / ans_s:.1f} GB/s",
            f"{ans_s * 1e3:.0f} ms",
            f"{floor(4 * n):.2f} ms",
        ),
        ("stage_delta end to end", f"{gb / stage_s:.1f} GB/s", f"{stage_s * 1e3:.0f} ms", f"{floor(2 * n):.2f} ms"),
        (
            "stage_delta, pack in pinned memory",
            f"{gb / pinned_s:.1f} GB/s",
            f"{pinned_s * 1e3:.0f} ms",
            f"{floor(2 * n):.2f} ms",
        ),
        (
            "stage_delta, nvCOMP ANS pack in pinned memory",
            f"{gb / ans_stage_s:.1f} GB/s",
            f"{ans_stage_s * 1e3:.0f} ms",
            f"{floor(2 * n):.2f} ms",
        ),
        ("apply (pause)", f"{apply_ms / gb:.3f} ms/GB", f"{apply_ms:.2f} ms", f"{floor(8 * changed):.2f} ms"),
        ("apply, patch in pinned host memory", f"{host_apply_ms / gb:.3f} ms/GB", f"{host_apply_ms:.2f} ms", ""),
    ]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "model": args.model,
        "lr": args.lr,
        "elements": n,
        "changed": changed,
        "density": changed / n,
        "pack_bytes": len(pack),
        "bits_per_element": 8 * len(pack) / n,
        "bit_exact": ok,
        "ans_bit_exact": ans_ok,
        "nvcomp_zstd_pack_bytes": len(nvz_pack),
        "ans_pack_bytes": len(ans_pack),
        "subset_cpu_zstd_pack_identical_to_cpu": cpu_pack == cpu_zstd_gpu,
        "subset_wire_gpu_over_cpu": len(gpu_pack) / len(cpu_pack),
        "encode_phases_ms": enc_phases,
        "stage_phases_ms": st_phases,
        "rows": rows,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "cuda_bench.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    print(f"{'stage':40s} {'rate':>14s} {'time':>12s} {'floor':>10s}")
    for r in rows:
        print(f"{r[0]:40s} {r[1]:>14s} {r[2]:>12s} {r[3]:>10s}")
    if args.profile:
        del state, staged
        fresh = {k: v.clone() for k, v in old.items()}
        staged = wt.stage_delta(fresh, pack)
        profile(
            {
                "encode": lambda: wt.encode_delta(old, new, base_version=0, version=1),
                "stage": lambda: wt.stage_delta(fresh, pack),
                "apply": lambda: wt.apply_staged(fresh, staged),
            },
            Path(args.out),
        )


if __name__ == "__main__":
    main()
