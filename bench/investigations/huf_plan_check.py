"""huf_plan (codec/cuda/zstd_literals/huffman.cu) against the kernel it replaced, a CTA of 256 threads a
block, on the GPU: the same info, code lengths, codes and tree descriptions on random and
skewed streams, then both kernels timed (CUDA events, median of 20) on a Qwen3-like launch:
~50,000 blocks of ~4 KB median (gap-bucket and residual symbols), empty blocks past them up
to the launch's bound. Exits non-zero on any difference.

    python bench/investigations/huf_plan_check.py [ORIGINAL.cu]   (default: git show 67916b7:...huffman.cu)
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: cuda_bench, versions
from cuda_bench import cuda_ms
from weight_teleport.codec.cuda.runtime import nvrtc
from weight_teleport.codec.cuda.zstd_literals import gpu_writer

DEV = "cuda"


def original() -> nvrtc.Module:
    if len(sys.argv) > 1:
        src = Path(sys.argv[1]).read_text()
    else:
        src = subprocess.run(
            ["git", "show", "67916b7:weight_teleport/codec/cuda/huffman.cu"],
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout
    return nvrtc.Module(src, "huffman_head.cu", {})


def check_streams(rng) -> list[np.ndarray]:
    out = []
    for i in range(1200):
        n = int(rng.integers(1, 300001)) if i % 4 == 0 else int(np.clip(rng.lognormal(7.5, 1.8), 1, 300000))
        kind = i % 10
        if kind == 0:
            d = np.full(n, rng.integers(0, 256))  # one symbol
        elif kind == 1:
            d = rng.choice(rng.choice(256, 2, replace=False), n)  # two
        elif kind == 2:
            d = rng.integers(0, 256, n) if i % 20 else np.arange(n) % 256  # all 256
        elif kind == 3:
            d = np.minimum(rng.geometric(rng.uniform(0.02, 0.6), n) - 1, 255)  # geometric
        elif kind == 4:
            d = np.minimum(rng.geometric(rng.uniform(0.05, 0.4), n) - 1, 40) * 5  # gap buckets
        elif kind == 5:
            d = np.where(rng.random(n) < 0.99, rng.integers(0, 8, n), rng.integers(129, 256, n))  # > 128
        elif kind == 6:
            d = 255 - np.minimum(rng.geometric(0.1, n) - 1, 255)
        elif kind == 7:  # counts of Fibonacci shape: trees deeper than 11 bits
            p = 1.618 ** -np.arange(25.0)
            d = rng.choice(25, n, p=p / p.sum()) * int(rng.integers(1, 11))
        elif kind == 8:
            d = rng.choice(256, n, p=rng.dirichlet(np.full(256, 0.05)))
        else:
            d = rng.integers(0, int(rng.integers(2, 257)), n)
        out.append(d.astype(np.uint8))
    return out


def qwen_like(rng, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stream bytes on the device, one stream a block: lognormal sizes (median ~4.3 KB), half
    gap-bucket symbols (geometric over 40 values, times 5), half residuals of a few values."""
    sizes = torch.from_numpy(np.clip(rng.lognormal(np.log(4347), 0.75, blocks), 16, 131072).astype(np.int64)).to(DEV)
    stream = torch.repeat_interleave(torch.arange(blocks, device=DEV), sizes)
    gap = torch.from_numpy(rng.random(blocks) < 0.5).to(DEV)
    p = torch.from_numpy(np.where(gap.cpu().numpy(), rng.uniform(0.05, 0.3, blocks), rng.uniform(0.5, 0.9, blocks))).to(
        DEV
    )
    g = torch.floor(torch.log(torch.rand(stream.numel(), device=DEV, dtype=torch.float64)) / torch.log1p(-p[stream]))
    residual = torch.tensor([0, 1, 255, 2, 254, 3], dtype=torch.uint8, device=DEV)
    return torch.where(gap[stream], torch.clamp(g, max=40) * 5, residual[torch.clamp(g, max=5).long()].double()).to(
        torch.uint8
    ), sizes


def layout(data: torch.Tensor, sizes: torch.Tensor):
    """The streams at 16-aligned offsets of one buffer."""
    slots = (sizes + 15) // 16 * 16
    offsets = torch.cumsum(slots, 0) - slots
    buf = torch.zeros(int(slots.sum()) + 16, dtype=torch.uint8, device=DEV)
    starts = torch.cumsum(sizes, 0) - sizes
    idx = torch.arange(data.numel(), device=DEV)
    stream = torch.repeat_interleave(torch.arange(sizes.numel(), device=DEV), sizes)
    buf[offsets[stream] + idx - starts[stream]] = data
    return buf, offsets, sizes


def both(old: nvrtc.Module, buf, offsets, lengths, max_blocks: int):
    """The new plan, the old one's outputs, and a launch of the old kernel and of the new one
    (at `warps` a CTA) into those outputs, for timing."""
    new = gpu_writer.plan(buf, offsets, lengths, 1, max_blocks)
    outs = [torch.empty_like(x) for x in (new.info, new.codes, new.code_lengths, new.trees)]
    args = [buf, new.blocks.src, new.size, *outs, max_blocks]
    run_old = lambda: old.launch("huf_plan", max_blocks, 256, args, buf.device)
    src = gpu_writer.SOURCE.read_text()
    mods = {}

    def run_new(warps: int = gpu_writer.PLAN_WARPS):
        if warps not in mods:
            defines = {"WRITE_THREADS": gpu_writer.THREADS, "PLAN_WARPS": warps}
            mods[warps] = nvrtc.Module(src, gpu_writer.SOURCE.name, defines)
        mods[warps].launch("huf_plan", -(-max_blocks // warps), 32 * warps, args, buf.device)

    run_old()
    return new, outs, run_new, run_old


def compare(name: str, new, outs) -> int:
    info, codes, lengths, trees = new.info, new.codes.view(-1, 256), new.code_lengths.view(-1, 256), new.trees
    o_info, o_codes, o_lengths, o_trees = outs[0], outs[1].view(-1, 256), outs[2].view(-1, 256), outs[3]
    trees, o_trees = trees.view(-1, gpu_writer.TREE_MAX), o_trees.view(-1, gpu_writer.TREE_MAX)
    real, rle = new.size > 0, o_info[:, 0] == 1
    col = torch.arange(8, device=DEV)
    cols = torch.where((real & rle)[:, None], col < 2, True)
    # the one stream of a block below 1024 bytes: the kernel before leaves its other three sizes unwritten
    cols &= ~((new.size < 1024)[:, None] & (col >= 3) & (col <= 5))
    bad = ((info != o_info) & cols).any(1)
    coded = real & ~rle
    bad |= coded & (lengths != o_lengths).any(1)
    bad |= coded & ((codes != o_codes) & (o_lengths > 0)).any(1)
    bad |= coded & ((trees != o_trees) & (torch.arange(gpu_writer.TREE_MAX, device=DEV) < o_info[:, 6:7])).any(1)
    n_bad = int(bad.sum())
    kinds = torch.bincount(o_info[real, 0], minlength=3).tolist()
    print(
        f"{name}: {int(real.sum())} blocks (raw, RLE, compressed: {kinds}), {n_bad} differ"
        + (f", first {torch.nonzero(bad)[:5, 0].tolist()}" if n_bad else "")
    )
    return n_bad


def main() -> int:
    rng = np.random.default_rng(0)
    old = original()
    streams = check_streams(rng)
    sizes = torch.tensor([s.size for s in streams], device=DEV)
    buf, offsets, lengths = layout(torch.from_numpy(np.concatenate(streams)).to(DEV), sizes)
    n_blocks = int((-(-lengths // gpu_writer.BLOCK_BYTES)).sum())
    bad = compare("check streams", *both(old, buf, offsets, lengths, n_blocks + 37)[:2])
    blocks = 49_400
    buf, offsets, lengths = layout(*qwen_like(rng, blocks))
    new, outs, run_new, run_old = both(old, buf, offsets, lengths, 128_823)
    bad += compare("Qwen3-like", new, outs)
    t_old = cuda_ms(run_old, 20)
    print(f"\n{'huf_plan, ' + str(blocks) + ' blocks in a launch of 128823':44s} {'ms':>8s}")
    print(f"{'before (a CTA of 256 threads a block)':44s} {t_old:8.3f}")
    for w in (1, 2, 4):
        t = cuda_ms(lambda: run_new(w), 20)
        mark = " (gpu_writer.py)" if w == gpu_writer.PLAN_WARPS else ""
        print(f"{f'new, {w} warps (blocks) a CTA{mark}':44s} {t:8.3f}   x{t_old / t:.2f}")
    bad += compare("Qwen3-like, 4 warps a CTA (the last timed)", new, outs)
    print(f"stream bytes {int(lengths.sum()) / 1e6:.0f} MB, median block {int(lengths.median())} bytes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
