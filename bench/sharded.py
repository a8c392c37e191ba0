"""Sharded publishing on the CPU: encode time and bytes per trainer rank against world size.

For each world size, that many gloo processes each hold the dim-0 shard of every tensor
(FSDP's `torch.chunk` split: uneven where a dim does not divide) of one seeded Qwen3-style
model and publish the same versions through `PublisherGroup` into a file:// store: a
snapshot, then deltas of AdamW-sized steps (each element moves by lr times a unit noise in
fp32, then the bf16 cast; about 1-3% of elements change). World size 1 is the baseline: one
process encoding every tensor whole, through the same code. Every version is read back from
the store and compared bit for bit with the unsharded weights before anything is printed.

Prints per world size, averaged over the deltas: each rank's encode time and part bytes
(max over ranks), the sum of part bytes, and the wall time of a whole version (encode,
upload, the group's commit and the manifest write).

    python bench/sharded.py [--worlds 1,2,4] [--hidden 512] [--layers 8] [--versions 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import tempfile
from datetime import timedelta

import torch

LR = 3e-6


def model_shapes(hidden: int, layers: int, vocab: int) -> dict[str, tuple[int, ...]]:
    """A Qwen3-style decoder's checkpoint shapes (untied embeddings, no biases)."""
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (hidden // 4, hidden),
            p + "self_attn.v_proj.weight": (hidden // 4, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (3 * hidden, hidden),
            p + "mlp.up_proj.weight": (3 * hidden, hidden),
            p + "mlp.down_proj.weight": (hidden, 3 * hidden),
            p + "input_layernorm.weight": (hidden,),
        }
    return shapes


def versions(shapes: dict, n: int):
    """The bf16 checkpoint of each of `n` versions (seeded: the same in every process)."""
    g = torch.Generator().manual_seed(0)
    master = {
        k: torch.randn(s, generator=g) * (0.02 if len(s) > 1 else 0.1) + (0 if len(s) > 1 else 1.0)
        for k, s in shapes.items()
    }
    for _ in range(n):
        yield {k: w.to(torch.bfloat16) for k, w in master.items()}
        for w in master.values():
            w.add_(torch.randn(w.shape, generator=g), alpha=-LR)


def shard(state: dict, rank: int, world: int):
    """Each tensor's dim-0 chunk of this rank (as FSDP2 splits), with its slice."""
    from weight_teleport.codec import TensorSlice

    local, slices = {}, {}
    for name, t in state.items():
        pieces = torch.chunk(t, world, 0)
        if rank >= len(pieces):
            continue
        start = sum(p.shape[0] for p in pieces[:rank])
        local[name] = pieces[rank].contiguous()
        slices[name] = TensorSlice(t.shape, [(start, pieces[rank].shape[0])] + [(0, d) for d in t.shape[1:]])
    return local, slices


def rank_main(rank: int, world: int, port: int, url: str, args, out) -> None:
    import torch.distributed as dist

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import PublisherGroup

    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    shapes = model_shapes(args.hidden, args.layers, args.vocab)
    config = PublisherConfig(anchor_every=10**6, threads=args.threads, level=args.level)
    rows = []
    with PublisherGroup(url, config) as group:
        for v, state in enumerate(versions(shapes, args.versions)):
            local, slices = shard(state, rank, world)
            r = group.publish(local, v, slices=slices)
            rows.append((v, r.kinds, r.encode_s, sum(r.part_bytes.values()), r.raw_bytes, r.total_s))
    out.put((rank, rows))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, args) -> list:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        url = f"file://{d}/store"
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, world, port, url, args, out)) for r in range(world)]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
            assert p.exitcode == 0, f"a rank of world {world} exited with {p.exitcode}"
        check(url, args)
    return [rows for _, rows in sorted(results)]


def check(url: str, args) -> None:
    """Every version in the store is bit-exact against the unsharded weights."""
    from weight_teleport.pipeline.fetch import materialize
    from weight_teleport.format.manifest import from_json
    from weight_teleport.store import open_store

    store = open_store(url)
    manifest = from_json(store.get_manifest())
    for v, want in enumerate(versions(model_shapes(args.hidden, args.layers, args.vocab), args.versions)):
        got, _ = materialize(store, manifest, v, threads=args.threads)
        for k, t in want.items():
            assert torch.equal(got[k].view(torch.int16), t.view(torch.int16)), (v, k)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--versions", type=int, default=4, help="a snapshot, then versions-1 deltas")
    ap.add_argument("--threads", type=int, default=1, help="encoder threads per rank")
    ap.add_argument("--level", type=int, default=3)
    args = ap.parse_args()
    shapes = model_shapes(args.hidden, args.layers, args.vocab)
    params = sum(torch.Size(s).numel() for s in shapes.values())
    print(
        f"model: {params / 1e6:.1f}M bf16 parameters ({2 * params / 1e6:.1f} MB), {len(shapes)} tensors; "
        f"{args.versions - 1} deltas at lr {LR}; {args.threads} encoder thread(s) per rank"
    )
    print(
        "| world | encode s / rank (max) | delta bytes / rank (max) | delta bytes, all ranks | "
        "vs world 1 | wall s / version |"
    )
    print("|---|---|---|---|---|---|")
    base = None
    for world in [int(w) for w in args.worlds.split(",")]:
        ranks = run_world(world, args)
        deltas = [[row for row in rows if "delta" in row[1]] for rows in ranks]
        enc = statistics.mean(max(rows[i][2] for rows in deltas) for i in range(len(deltas[0])))
        per_rank = statistics.mean(max(rows[i][3] for rows in deltas) for i in range(len(deltas[0])))
        total = statistics.mean(sum(rows[i][3] for rows in deltas) for i in range(len(deltas[0])))
        wall = statistics.mean(max(rows[i][5] for rows in deltas) for i in range(len(deltas[0])))
        base = base or total
        print(
            f"| {world} | {enc:.3f} | {per_rank / 1e3:.1f} kB | {total / 1e3:.1f} kB | {total / base:.3f}x "
            f"| {wall:.3f} |"
        )


if __name__ == "__main__":
    main()
