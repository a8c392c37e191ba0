"""Huffman-literal zstd frames against the CPU's zstd on real symbol streams: a delta of a
model config's bf16 weights (AdamW-sized steps, as bench/cuda_bench.py makes them) encoded by
the CPU backend; every stream of its sparse chunks written again by the reference frame
writer (codec/cuda/zstd_literals/reference.py, the bytes the GPU writes), decoded back by zstandard, and
the stored sizes compared (a stream is stored raw where that is smaller, as the encoders do).

    python bench/investigations/huffman_frames.py [--model qwen3-0.6b] [--lr 5e-7]
"""

import argparse
import time

import numpy as np
import torch
import zstandard

import weight_teleport as wt
from weight_teleport.bench.simulate import make_config, make_state
from weight_teleport.codec import streams as codecs
from weight_teleport.codec.plan import class_maps
from weight_teleport.codec.cuda.kernels import stream_tables
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.codec.cuda.zstd_literals.reference import frame
from weight_teleport.format import read_header


def delta_pack(model: str, lr: float) -> bytes:
    master = make_state(make_config(model), 0)
    gen = torch.Generator().manual_seed(0)
    old, new = {}, {}
    for name in list(master):
        w = master.pop(name)
        old[name] = w.to(torch.bfloat16)
        new[name] = w.add_(torch.randn(w.shape, generator=gen), alpha=-lr).to(torch.bfloat16)
    return wt.encode_delta(old, new, base_version=0, version=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--lr", type=float, default=5e-7)
    args = ap.parse_args()
    pack = delta_pack(args.model, args.lr)
    header, buf = read_header(pack), np.frombuffer(pack, np.uint8)
    unzstd = zstandard.ZstdDecompressor()
    n_streams, stored, ours, raw_total, seconds = 0, 0, 0, 0, 0.0
    for rec in header.tensors:
        if rec.codec != "sparse":
            continue
        _, inverted, n_classes = class_maps([rec], BY_NAME[rec.dtype])
        starts = header.payload_offset + np.array([c.offset for c in rec.chunks], np.int64)
        lengths = np.array([c.length for c in rec.chunks], np.int64)
        k = int(n_classes[0])
        st = stream_tables.read(buf, starts, lengths, np.full(starts.size, k), k)
        for codec, raw_len, size, at in zip(*(a.ravel() for a in (st.codec, st.raw, st.stored, st.at))):
            if raw_len == 0:
                continue
            data = buf[at : at + size].tobytes()
            raw = unzstd.decompress(data, max_output_size=int(raw_len)) if codec == codecs.ZSTD else data
            stored += int(size)
            raw_total += int(raw_len)
            if raw_len < 16:  # stored raw by every encoder
                ours += int(size)
                continue
            t0 = time.perf_counter()
            f = frame(raw)
            seconds += time.perf_counter() - t0
            assert unzstd.decompress(f, max_output_size=int(raw_len)) == raw
            ours += min(len(f), int(raw_len))
            n_streams += 1
    print(
        f"{args.model}, lr {args.lr}: pack {len(pack)} bytes, {n_streams} streams of 16 bytes or more, "
        f"{raw_total} raw bytes, every frame decoded by zstandard to its stream"
    )
    print(
        f"stored by the CPU's zstd: {stored} bytes; as Huffman-literal frames: {ours} bytes "
        f"({ours / stored:.4f}x); the reference writer took {seconds:.1f} s (Python)"
    )


if __name__ == "__main__":
    main()
