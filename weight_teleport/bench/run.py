"""The delta benchmark: our codec and the peers' codecs on the same simulated RL steps.

For each learning rate, AdamW steps of a simulated Qwen3-style model give (old, new)
bf16 pairs. Every codec encodes and decodes every pair in this process; every round trip
is checked bit-exact; sizes are compared with the delta's order-0 entropy bound, and
speeds are reported in GB/s of bf16 weights (2 bytes per element).

With a sampler format (`sampler_format="fp8-block"`, `weight_teleport.quantize`), each row
also measures our codec on the same steps quantized as the sampler holds them: old and new
are both quantized and the quantized pair is encoded and decoded (bit-exact), the encode's
cost counting the quantization of the new state (row["sampler_format"]).
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import TypeVar
from pathlib import Path

import numpy as np
import torch

from weight_teleport.bench.baselines import BASELINES, BaselineUnavailable, State
from weight_teleport.bench.entropy import bit_view, delta_entropy
from weight_teleport.bench.simulate import REAL_STEPS, UNCALIBRATED, Calibration, delta_pairs, make_config, make_state
from weight_teleport.format.codecs import CHOICES, DEFAULT
from weight_teleport.quantize import SamplerFormat, sampler_format as make_sampler_format

OURS = "weight_teleport"
"""Our codec with its default codec of sparse records; with another, OURS + "_" + its name
(`weight_teleport_sparse_ac`: `encode_delta(codec="sparse_ac")`)."""
REFERENCE = "xor_zstd1"


@dataclasses.dataclass(frozen=True)
class Codec:
    """A codec under test; ``decode(old, blob)`` returns the new state."""

    name: str
    encode: Callable[[State, State], bytes]
    decode: Callable[[State, bytes], State]
    in_place: bool = False
    """``decode`` patches the state it is given: it gets a copy made outside the timer."""


def _our_codec(threads: int | None, codec: str = DEFAULT) -> Codec | None:
    try:
        from weight_teleport.codec import apply_delta, encode_delta
    except ImportError as e:
        print(f"note: {OURS} codec not importable ({e}); benchmarking the baselines only")
        return None

    def encode(old: State, new: State) -> bytes:
        pack = encode_delta(old, new, base_version=0, version=1, threads=threads, codec=codec)
        assert isinstance(pack, bytes)  # not pinned
        return pack

    def decode(state: State, blob: bytes) -> State:
        assert isinstance(state, dict)  # in_place: the copy made for it
        apply_delta(state, blob, threads=threads)
        return state

    return Codec(OURS if codec == DEFAULT else f"{OURS}_{codec}", encode, decode, in_place=True)


def codecs(threads: int | None = None) -> list[Codec]:
    """Our codec with each codec of sparse records (when importable; the default first)
    followed by every baseline."""
    ours = [c for c in (_our_codec(threads, name) for name in CHOICES) if c]
    peers = [Codec(b.name, b.encode, b.decode) for b in BASELINES]
    return ours + peers


def _same_bits(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and torch.equal(bit_view(a[n]), bit_view(b[n])) for n in a
    )


T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _run_codec(codec: Codec, old: State, new: State, repeats: int) -> dict:
    """Encode and decode one pair ``repeats`` times; return size and timings."""
    encode_s, decode_s = [], []
    for _ in range(repeats):
        blob, seconds = _timed(lambda: codec.encode(old, new))
        encode_s.append(seconds)
        base = {n: t.clone() for n, t in old.items()} if codec.in_place else old
        decoded, seconds = _timed(lambda: codec.decode(base, blob))
        decode_s.append(seconds)
        if not _same_bits(decoded, new):
            raise RuntimeError(f"{codec.name}: decoded state differs from the new state")
    return {"bytes": len(blob), "encode_s": encode_s, "decode_s": decode_s}


def _summarise(runs: list[dict], elements: int, weight_bytes: int) -> dict:
    wire = sum(r["bytes"] for r in runs) / len(runs)
    encode_s = statistics.median(s for r in runs for s in r["encode_s"])
    decode_s = statistics.median(s for r in runs for s in r["decode_s"])
    return {
        "available": True,
        "bytes_per_step": wire,
        "bits_per_element": wire * 8 / elements,
        "encode_gbps": weight_bytes / encode_s / 1e9,
        "decode_gbps": weight_bytes / decode_s / 1e9,
    }


def _add_ratios(row: dict) -> None:
    """Add each codec's ratio to the order-0 bound and XOR+zstd-1's size over its size."""
    reference = row["codecs"].get(REFERENCE, {})
    for stats in row["codecs"].values():
        if stats["available"]:
            stats["ratio_to_bound"] = stats["bits_per_element"] / row["bound_bits_per_element"]
            if reference.get("available"):
                stats["xor_zstd1_over_this"] = reference["bytes_per_step"] / stats["bytes_per_step"]


def bench_lr(
    master: dict[str, torch.Tensor],
    lr: float,
    steps: int,
    seed: int,
    codec_list: list[Codec],
    repeats: int,
    calibration: Calibration = UNCALIBRATED,
    fmt: SamplerFormat | None = None,
) -> dict:
    """Benchmark every codec on ``steps`` simulated steps at ``lr``; ``master`` (made with
    the same ``calibration``) advances."""
    return bench_pairs(lr, delta_pairs(master, lr, steps, seed, calibration), codec_list, repeats, fmt)


def _quantized_parts(fmt: SamplerFormat, state: State) -> dict[str, str]:
    """Each tensor of ``fmt``'s layout of ``state`` -> its part: "fp8" (quantized weights),
    "scales" (their scales) or "unquantized"."""
    parts = {}
    for name, t in state.items():
        if fmt.quantized(name, t):
            parts[name], parts[fmt.scale_name(name)] = "fp8", "scales"
        else:
            parts[name] = "unquantized"
    return parts


def _quantize(fmt: SamplerFormat, state: State) -> State:
    out = {n: torch.empty(shape, dtype=dtype) for n, (shape, dtype) in fmt.layout(state).items()}
    fmt.quantize(state, out)
    return out


def _changed_by_part(parts: dict[str, str], old: State, new: State) -> dict[str, list[int]]:
    """Part -> [changed elements, elements], an element changed when its bit pattern did."""
    counts: dict[str, list[int]] = {p: [0, 0] for p in ("fp8", "scales", "unquantized")}
    for name, part in parts.items():
        counts[part][0] += int((bit_view(old[name]) != bit_view(new[name])).sum())
        counts[part][1] += old[name].numel()
    return counts


def _quantized_pair(fmt: SamplerFormat, old: State, new: State, repeats: int) -> tuple[State, State, list[float]]:
    """(quantized old, quantized new, seconds of each of ``repeats`` quantizations of new)
    on the CPU (the torch reference); the output tensors are allocated outside the timer."""
    q_old = _quantize(fmt, old)
    q_new = {n: torch.empty_like(t) for n, t in q_old.items()}
    seconds = []
    for _ in range(repeats):
        _, s = _timed(lambda: fmt.quantize(new, q_new))
        seconds.append(s)
    return q_old, q_new, seconds


def _summarise_quantized(
    fmt: SamplerFormat,
    runs: dict[str, list[dict]],
    quantize_s: list[float],
    changed: list[dict],
    weight_bytes: int,
    bf16: dict[str, dict],
) -> dict:
    """row["sampler_format"]: the quantized pairs' changes, our codecs' sizes and costs
    (speeds in GB/s of the bf16 weights, as the row's other speeds; sizes also over the
    same codec's on the bf16 pairs, ``bf16``)."""
    elements = sum(c[1] for c in changed[0].values())
    densities = [sum(c[0] for c in step.values()) / elements for step in changed]
    quantize_median = statistics.median(quantize_s)
    codecs: dict[str, dict] = {}
    for name, codec_runs in runs.items():
        stats = _summarise(codec_runs, elements, weight_bytes)
        encode_s = statistics.median(s for r in codec_runs for s in r["encode_s"])
        decode_s = statistics.median(s for r in codec_runs for s in r["decode_s"])
        codecs[name] = stats | {
            "bits_per_changed_element": stats["bits_per_element"] / max(statistics.mean(densities), 1e-12),
            "encode_ms": encode_s * 1e3,
            "encode_ms_incl_quantize": (encode_s + quantize_median) * 1e3,
            "encode_gbps_incl_quantize": weight_bytes / (encode_s + quantize_median) / 1e9,
            "decode_ms": decode_s * 1e3,
            "bytes_over_bf16": stats["bytes_per_step"] / bf16[name]["bytes_per_step"],
        }
    return {
        "name": fmt.name,
        "elements": elements,
        "density": statistics.mean(densities),
        "densities": densities,
        "changed_by_part": {
            part: {"changed": statistics.mean(step[part][0] for step in changed), "elements": changed[0][part][1]}
            for part in changed[0]
        },
        "quantize_ms": quantize_median * 1e3,
        "quantize_gbps": weight_bytes / quantize_median / 1e9,
        "codecs": codecs,
    }


def bench_pairs(lr: float, pairs, codec_list: list[Codec], repeats: int, fmt: SamplerFormat | None = None) -> dict:
    """Benchmark every codec on the (old, new) states of ``pairs``, one row; with ``fmt``,
    our codecs also on the pairs quantized to it (row["sampler_format"])."""
    runs: dict[str, list[dict]] = {c.name: [] for c in codec_list}
    unavailable, entropies = {}, []
    ours = [c for c in codec_list if c.name == OURS or c.name.startswith(OURS + "_")] if fmt else []
    q_runs: dict[str, list[dict]] = {c.name: [] for c in ours}
    q_changed: list[dict] = []
    quantize_s: list[float] = []
    for old, new in pairs:
        entropies.append(delta_entropy(old, new))
        if fmt and ours:
            q_old, q_new, seconds = _quantized_pair(fmt, old, new, repeats)
            quantize_s += seconds
            q_changed.append(_changed_by_part(_quantized_parts(fmt, old), q_old, q_new))
            for codec in ours:
                q_runs[codec.name].append(_run_codec(codec, q_old, q_new, repeats))
            del q_old, q_new
        for codec in codec_list:
            if codec.name in unavailable:
                continue
            try:
                runs[codec.name].append(_run_codec(codec, old, new, repeats))
            except BaselineUnavailable as e:
                unavailable[codec.name] = {"available": False, "reason": str(e)}
    elements = entropies[0].elements
    weight_bytes = sum(t.numel() * t.element_size() for t in old.values())
    stats = {c.name: unavailable.get(c.name) or _summarise(runs[c.name], elements, weight_bytes) for c in codec_list}
    row = {
        "lr": lr,
        "elements": elements,
        "density": statistics.mean(e.density for e in entropies),
        "densities": [e.density for e in entropies],
        "residual_bits": statistics.mean(e.residual_bits for e in entropies),
        "bound_bits_per_element": statistics.mean(e.bound_bits_per_element for e in entropies),
        "codecs": stats,
    }
    _add_ratios(row)
    if fmt and ours:
        row["sampler_format"] = _summarise_quantized(fmt, q_runs, quantize_s, q_changed, weight_bytes, stats)
    return row


def _machine() -> dict:
    import zstandard

    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "zstandard": zstandard.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _print_row(row: dict) -> None:
    loss = f" {row['loss']}" if "loss" in row else ""
    print(
        f"lr {row['lr']:.0e}{loss}: density {row['density']:.3%}, residual {row['residual_bits']:.2f} bits,"
        f" order-0 bound {row['bound_bits_per_element']:.4f} bits/elem"
    )
    print(
        f"  {'codec':<16}{'bits/elem':>10}{'bits/chg':>10}{'x bound':>9}{'xor/this':>10}{'enc GB/s':>10}{'dec GB/s':>10}"
    )
    for name, s in row["codecs"].items():
        if not s["available"]:
            print(f"  {name:<16}not available: {s['reason']}")
            continue
        print(
            f"  {name:<16}{s['bits_per_element']:>10.4f}{s['bits_per_element'] / max(row['density'], 1e-12):>10.2f}"
            f"{s['ratio_to_bound']:>9.2f}"
            f"{s.get('xor_zstd1_over_this', float('nan')):>10.2f}"
            f"{s['encode_gbps']:>10.3f}{s['decode_gbps']:>10.3f}"
        )


def _print_sampler_table(rows: list[dict]) -> None:
    """The quantized pairs beside the bf16 ones: one line per row (each of our codec choices)."""
    rows = [r for r in rows if "sampler_format" in r]
    if not rows:
        return
    names = list(rows[0]["sampler_format"]["codecs"])
    label = " / ".join(n.removeprefix(OURS).lstrip("_") or DEFAULT for n in names)
    fmt_name = rows[0]["sampler_format"]["name"]
    print(
        f"\nsampler format {fmt_name}: our codec on the quantized steps ({label}; sizes in kB per step,"
        f" encode ms per step including the quantization of the new state on this CPU)"
    )
    header = (
        f"  {'lr':<10}{'bf16 chg %':>11}{'fp8 chg %':>11}{'fp8 w chg %':>12}{'bf16 pack kB':>22}{'fp8 pack kB':>22}"
        f"{'fp8/bf16':>14}{'quant ms':>10}{'enc ms incl q':>20}{'enc GB/s incl q':>18}{'dec GB/s':>16}"
    )
    print(header)

    def pair(values, spec: str) -> str:
        return " / ".join(format(v, spec) for v in values)

    for r in rows:
        q = r["sampler_format"]
        bf16 = [r["codecs"][n] for n in names]
        fp8 = [q["codecs"][n] for n in names]
        weights = q["changed_by_part"]["fp8"]
        lr = f"{r['lr']:.0e}" + (f" {r['loss']}" if "loss" in r else "")
        print(
            f"  {lr:<10}{r['density']:>11.3%}{q['density']:>11.3%}{weights['changed'] / weights['elements']:>12.3%}"
            f"{pair((s['bytes_per_step'] / 1e3 for s in bf16), '.1f'):>22}"
            f"{pair((s['bytes_per_step'] / 1e3 for s in fp8), '.1f'):>22}"
            f"{pair((s['bytes_over_bf16'] for s in fp8), '.2f'):>14}"
            f"{q['quantize_ms']:>10.1f}"
            f"{pair((s['encode_ms_incl_quantize'] for s in fp8), '.1f'):>20}"
            f"{pair((s['encode_gbps_incl_quantize'] for s in fp8), '.3f'):>18}"
            f"{pair((s['decode_gbps'] for s in fp8), '.3f'):>16}"
        )
    print(
        "  (chg %: elements whose bit pattern changed; fp8: the fp8 weights, their float32 scales and the"
        " unquantized tensors; fp8 w: the fp8 weights alone; GB/s of the bf16 weights)"
    )


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    density = [r["density"] for r in rows]
    ax.plot(density, [r["bound_bits_per_element"] for r in rows], "k--", label="order-0 bound")
    for name in rows[0]["codecs"]:
        points = [(r["density"], r["codecs"][name]) for r in rows]
        points = [(d, s["bits_per_element"]) for d, s in points if s["available"]]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="changed elements (density)", ylabel="bits per element")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sim_rows(config_name: str, lrs, steps: int, seed: int, codec_list, repeats: int, calibration, fmt=None):
    config = make_config(config_name)
    initial = make_state(config, seed, calibration=calibration)
    for lr in lrs:
        master = {n: w.clone() for n, w in initial.items()}
        yield bench_lr(master, lr, steps, seed, codec_list, repeats, calibration, fmt)


def _real_rows(real_config, cache_dir, codec_list, repeats: int, fmt=None):
    from weight_teleport.bench.real import real_runs

    for lr, loss, pairs in real_runs(real_config, cache_dir):
        yield bench_pairs(lr, pairs, codec_list, repeats, fmt) | {"loss": loss}


def run_bench(
    config_name: str = "small",
    lrs: tuple[float, ...] = (1e-6, 3e-6, 1e-5),
    steps: int = 2,
    seed: int = 0,
    out_dir: str | Path = "out/bench",
    threads: int | None = None,
    repeats: int = 2,
    data: str = "sim",
    real_config=None,
    cache_dir: str | Path = "out/bench-real",
    calibration: Calibration = REAL_STEPS,
    sampler_format: str | None = None,
) -> dict:
    """Run the benchmark, print a table, write ``bench.json`` and ``bench.png`` into
    ``out_dir`` and return the results. ``threads`` goes to our codec; baselines run on
    one thread. ``data`` "sim": simulated steps of ``config_name`` (every lr starts from the
    same weights and optimizer seed; ``calibration`` scales them, `REAL_STEPS` by default:
    changes as frequent as real steps' at the same lr); "real": real steps of a real model
    (``weight_teleport.bench.real``, settings ``real_config``, trained once into ``cache_dir``).
    ``sampler_format`` ("fp8-block"): each row also measures our codecs on the steps
    quantized to that format (row["sampler_format"], an extra table)."""
    if steps < 1 or repeats < 1:
        raise ValueError(f"steps and repeats must be at least 1, got {steps} and {repeats}")
    fmt = make_sampler_format(sampler_format)
    codec_list = codecs(threads)
    if fmt and not any(c.name == OURS for c in codec_list):
        print(f"note: {OURS} codec not importable; no measurement of the {fmt.name} sampler format")
    if data == "sim":
        rows_iter = _sim_rows(config_name, lrs, steps, seed, codec_list, repeats, calibration, fmt)
        described = {
            "config": dataclasses.asdict(make_config(config_name)),
            "calibration": dataclasses.asdict(calibration),
        }
    elif data == "real":
        from weight_teleport.bench.real import RealConfig

        real_config = real_config or RealConfig(lrs=tuple(lrs), steps=steps, seed=seed)
        rows_iter = _real_rows(real_config, cache_dir, codec_list, repeats, fmt)
        described = {"real": dataclasses.asdict(real_config)}
    else:
        raise ValueError(f"data must be 'sim' or 'real', got {data!r}")
    rows = []
    for row in rows_iter:
        rows.append(row)
        _print_row(row)
    _print_sampler_table(rows)
    result = {
        "machine": _machine(),
        "data": data,
        **described,
        "params": {
            "lrs": list(lrs),
            "steps": steps,
            "seed": seed,
            "threads": threads,
            "repeats": repeats,
            "sampler_format": sampler_format,
        },
        "results": rows,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, out / "bench.png")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
    return result


def main(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed options (`weight_teleport.cli.bench`); return the exit
    status."""
    real_config = None
    if args.data == "real":
        from weight_teleport.bench.real import RealConfig

        real_config = RealConfig(model=args.model, lrs=tuple(args.lrs), steps=args.steps, seed=args.seed)
    calibration = UNCALIBRATED if args.uncalibrated else REAL_STEPS
    run_bench(
        args.config,
        tuple(args.lrs),
        args.steps,
        args.seed,
        args.out_dir,
        args.threads,
        args.repeats,
        args.data,
        real_config,
        args.cache_dir,
        calibration,
        getattr(args, "sampler_format", None),
    )
    return 0
