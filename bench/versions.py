"""encode_delta and stage_delta of several versions of this code side by side in one
process, alternating call by call (end-to-end times move by 10-30 ms between machines and
runs, so versions are compared within one process). Each version is a git revision of this
repository or a directory holding a `weight_teleport` package; its package is imported under
a name of its own. On CUDA the Qwen3-8B-shaped delta of cuda_bench.py, else a smaller model
on the CPU. Checks that every version writes the same pack and that its stage + apply is
bit-exact, then prints per version the median, min and max wall time of each call (CUDA
synchronised). With --apart each call's repeats run in a row instead.

    python bench/versions.py 1806e1a . [--calls 10] [--what encode,encode_pinned,stage,pinned] [--model qwen3-8b]
"""

import argparse
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

from cuda_bench import make_delta

ROOT = Path(__file__).resolve().parent.parent


def _package(version: str, into: Path, index: int) -> str:
    """Copy version's weight_teleport under into/NAME, renamed NAME throughout; NAME."""
    name = f"wt_v{index}_{re.sub(r'[^0-9A-Za-z]', '_', version)[:16]}"
    src = Path(version)
    dst = into / name
    if (src / "weight_teleport").is_dir():
        shutil.copytree(src / "weight_teleport", dst, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", version, "weight_teleport"], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(tar)) as t:
            t.extractall(into / "_tmp", filter="data")
        (into / "_tmp" / "weight_teleport").rename(dst)
    for f in dst.rglob("*"):
        if f.is_file() and f.suffix in (".py", ".cu"):
            f.write_text(f.read_text().replace("weight_teleport", name))
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="+", help="git revisions or directories holding weight_teleport/")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument(
        "--what",
        default="encode,stage",
        help="of encode, encode_pinned (the pack written into "
        "pinned memory), stage, pinned (stage of the pack in pinned memory); the pinned ones CUDA only",
    )
    ap.add_argument("--model", default=None, help="default: qwen3-8b on CUDA, qwen3-0.6b on the CPU")
    ap.add_argument("--apart", action="store_true", help="each call's repeats in a row, not alternated")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if "pinned" in args.what and device != "cuda":
        ap.error("--what pinned and encode_pinned use pinned memory: CUDA only")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    tmp = Path(tempfile.mkdtemp(prefix="wt_versions_"))
    sys.path.insert(0, str(tmp))
    mods = {v: importlib.import_module(_package(v, tmp, i)) for i, v in enumerate(args.versions)}
    old, new = make_delta(args.model or ("qwen3-8b" if device == "cuda" else "qwen3-0.6b"), 5e-7, device=device)
    pack = None
    for v, m in mods.items():
        p = m.encode_delta(old, new, base_version=0, version=1)
        pack = pack or p
        state = {k: t.clone() for k, t in old.items()}
        m.apply_staged(state, m.stage_delta(state, pack))
        exact = all(torch.equal(state[k].view(torch.int16), new[k].view(torch.int16)) for k in new)
        print(
            f"{v}: pack {len(p)} bytes, {'the same' if p == pack else 'DIFFERENT'}; stage + apply "
            f"{'bit-exact' if exact else 'NOT EXACT'}",
            flush=True,
        )
    state = {k: t.clone() for k, t in old.items()}
    pinned = next(iter(mods.values())).pinned_pack(pack) if "pinned" in args.what else None
    if pinned is not None:
        for m in mods.values():  # untimed: each version's first stage of a pinned pack took 0.9-1.6 s
            m.stage_delta(state, pinned)
    calls = {
        "encode": lambda m: m.encode_delta(old, new, base_version=0, version=1),
        "encode_pinned": lambda m: m.encode_delta(old, new, base_version=0, version=1, pinned=True),
        "stage": lambda m: m.stage_delta(state, pack),
        "pinned": lambda m: m.stage_delta(state, pinned),
    }
    if "encode_pinned" in args.what:  # versions without pinned packs are left out of its rows
        mods_of = {v: m for v, m in mods.items() if "pinned" in inspect.signature(m.encode_delta).parameters}
        for v, m in mods_of.items():
            same = bytes(calls["encode_pinned"](m)) == pack
            print(f"{v}: pack in pinned memory {'the same' if same else 'DIFFERENT'}", flush=True)
    times: dict = {}
    runs = [
        (what, v, m) for what in args.what.split(",") for v, m in (mods_of if what == "encode_pinned" else mods).items()
    ]
    order = [r for r in runs for _ in range(args.calls)] if args.apart else runs * args.calls
    for what, v, m in order:
        sync()
        s = time.perf_counter()
        calls[what](m)
        sync()
        times.setdefault((what, v), []).append((time.perf_counter() - s) * 1e3)
    print(f"{device}, {len(old)} tensors, {args.calls} calls each, {'in a row' if args.apart else 'alternated'}")
    for (what, v), ts in times.items():
        ts = sorted(ts)
        print(f"{what:>7} {v:>24}: median {ts[len(ts) // 2]:7.1f} ms  min {ts[0]:7.1f}  max {ts[-1]:7.1f}")


if __name__ == "__main__":
    main()
