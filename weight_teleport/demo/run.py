"""`weight-teleport demo`: a disaggregated RL run on one CPU.

A trainer process and a sampler process share nothing but an HTTP origin: the trainer
publishes every weight version as a pack, the sampler follows the packs while it keeps a
real HF transformers model up to date, generates rollouts and sends them back through the
same origin. Afterwards the same run is repeated in one process without any transport, and
the sampler's weights must match it bit for bit at every version. With `--trainer-ranks N`
the trainer is N processes under FSDP2, each publishing its own shard (`demo/sharded.py`)."""

import argparse
import multiprocessing as mp
import queue
import secrets
import tempfile
import time
from pathlib import Path

import torch

from weight_teleport.demo import roles
from weight_teleport.demo.policy import DemoConfig

HEADER = (
    f"{'version':>7} {'changed':>8} {'wire':>9} {'of full':>8} {'encode':>7} {'fetch':>6} "
    f"{'stage':>6} {'to ready':>8} {'pause':>6} {'digest':>6} {'reward':>6}"
)


def _config(args: argparse.Namespace) -> DemoConfig:
    if args.steps < 1 or args.batch < 1 or args.layers < 1 or args.lr <= 0:
        raise ValueError("--steps, --batch and --layers must be >= 1 and --lr > 0")
    if args.hidden < 16 or args.hidden % 4:
        raise ValueError("--hidden must be a multiple of 4, at least 16")
    if args.trainer_ranks < 1 or (args.trainer_ranks > 1 and args.engine != "hf"):
        raise ValueError("--trainer-ranks must be >= 1, and 1 with --engine vllm")
    return DemoConfig(
        steps=args.steps,
        lr=args.lr,
        batch=args.batch,
        hidden=args.hidden,
        layers=args.layers,
        seed=args.seed,
        trainer_ranks=args.trainer_ranks,
    )


def _verdict(t: dict, s: dict) -> str:
    """'ok' when the sampler's weights have the digests of what the trainer published (or,
    for an engine with its own layout, when the subscriber verified without resyncing)."""
    if s["resynced"]:
        return "resync"
    if not s["digests"] or t["published"] is None:  # sharded trainers: checked by the colocated run
        return "ok"
    return "ok" if s["digests"] == t["published"] else "DIFF"


def _print_row(v: int, t: dict, s: dict) -> None:
    changed = f"{t['changed'] / t['numel']:.2%}" if "changed" in t else "anchor"
    reward = f"{s['reward']:.3f}" if "reward" in s else "-"
    print(
        f"{v:>7} {changed:>8} {t['wire'] / 1e3:>7.0f}kB {t['wire'] / t['full']:>8.2%} "
        f"{t['encode_ms']:>5.0f}ms {s['fetch_ms']:>4.0f}ms {s['stage_ms']:>4.0f}ms "
        f"{(s['ready_at'] - t['published_at']) * 1e3:>6.0f}ms {s['pause_ms']:>4.1f}ms "
        f"{_verdict(t, s):>6} {reward:>6}",
        flush=True,
    )


def say(text: str) -> None:
    """A line of what the demo is doing, shown at once (stdout may be a pipe)."""
    print(text, flush=True)


def _collect(cfg: DemoConfig, rows, procs, numel: int) -> tuple[list[dict], bool]:
    """Print what the processes say they are doing (`("note", None, text)`), and each
    version's row, under the table's header, as soon as both processes reported it; then
    wait for the sampler's final check of its weights against the trainer's."""
    trainer: dict[int, dict] = {}
    sampler: dict[int, dict] = {}
    check: dict[int, dict] = {}
    printed = 0
    while printed <= cfg.steps or not check:
        try:
            role, v, data = rows.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"the {dead[0].name} process failed (exit code {dead[0].exitcode})")
            continue
        if role == "note":
            say(data)
            continue
        {"trainer": trainer, "sampler": sampler, "check": check}[role].setdefault(v, {}).update(data)
        while (
            printed in sampler
            and "published_at" in trainer.get(printed, {})
            and (printed == 0 or "changed" in trainer[printed])
        ):
            if printed == 0:
                say(HEADER)
            _print_row(printed, {**trainer[printed], "numel": numel}, sampler[printed])
            printed += 1
    return [{**trainer[v], **sampler[v]} for v in range(cfg.steps + 1)], check[cfg.steps]["matches_trainer"]


def _run(cfg: DemoConfig, engine: str) -> tuple[list[dict], bool]:
    from weight_teleport.demo.policy import build_model
    from weight_teleport.server import OriginServer, ServerConfig

    token = secrets.token_hex(16)
    say("building the model and starting the origin...")
    numel = sum(p.numel() for p in build_model(cfg, torch.bfloat16).parameters())
    say(f"a {numel / 1e6:.1f}M-parameter Qwen3-style model, {cfg.steps} RL steps")
    with (
        tempfile.TemporaryDirectory() as root,
        OriginServer(ServerConfig(root=Path(root), port=0, token=token)) as origin,
    ):
        ctx = mp.get_context("spawn")
        rows = ctx.Queue()
        procs = _trainers(ctx, origin.url, token, cfg, rows)
        procs.append(ctx.Process(target=roles.sampler, args=(origin.url, token, cfg, rows, engine), name="sampler"))
        for p in procs:
            p.start()
        trainers = ", ".join(str(p.pid) for p in procs[:-1])
        what = "trainer pid" if cfg.trainer_ranks == 1 else f"{cfg.trainer_ranks} trainer ranks (FSDP2, gloo), pids"
        say(
            f"origin {origin.url}; {what} {trainers}, sampler pid {procs[-1].pid}: each loads torch "
            f"and transformers and builds its model; the codec's kernels compile on first use"
        )
        try:
            result = _collect(cfg, rows, procs, numel)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
    return result


def _trainers(ctx, url: str, token: str, cfg: DemoConfig, rows) -> list:
    """The trainer's process, or the processes of its ranks (`sharded.trainer_rank`)."""
    if cfg.trainer_ranks == 1:
        return [ctx.Process(target=roles.trainer, args=(url, token, cfg, rows), name="trainer")]
    from weight_teleport.demo import sharded

    port = _free_port()
    return [
        ctx.Process(
            target=sharded.trainer_rank,
            args=(r, cfg.trainer_ranks, port, url, token, cfg, rows),
            name=f"trainer rank {r}",
        )
        for r in range(cfg.trainer_ranks)
    ]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["reward"] for r in table if "reward" in r], marker=".")
    ax.set_xlabel("version (optimizer step)")
    ax.set_ylabel("mean reward of the rollouts")
    ax.set_title("weight-teleport demo: reward of the sampler's rollouts")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    cfg = _config(args)
    t0 = time.perf_counter()
    table, matches = _run(cfg, args.engine)
    wire = sum(r["wire"] for r in table[1:])
    full = sum(r["full"] for r in table[1:])
    rewards = [r["reward"] for r in table if "reward" in r]
    print(
        f"\n{cfg.steps} updates in {time.perf_counter() - t0:.0f} s: {wire / 1e6:.1f} MB on the wire "
        f"instead of {full / 1e6:.0f} MB of full bf16 weights ({full / wire:.0f}x less); "
        f"mean pause {sum(r['pause_ms'] for r in table) / len(table):.1f} ms"
    )
    k = max(1, len(rewards) // 5)
    print(
        f"reward: {sum(rewards[:k]) / k:.3f} over the first {k} versions -> "
        f"{sum(rewards[-k:]) / k:.3f} over the last {k}"
    )
    plot = Path(args.out_dir) / "reward.png"
    _plot(table, plot)
    print(f"reward curve: {plot}")
    verified = sum(_verdict(r, r) == "ok" for r in table)
    print(f"digests verified at {verified} of {len(table)} versions")
    if matches is None:  # sharded trainers hold no whole tensor to compare with: the colocated run does
        matches = verified == len(table)
    else:
        matches = matches and verified == len(table)
        what = "vLLM's own loader of the trainer's" if args.engine == "vllm" else "the trainer's"
        print(f"sampler weights after the last version equal {what}, bit for bit: {'yes' if matches else 'NO'}")
    if args.no_check or args.engine != "hf" or not matches:
        return 0 if matches else 1
    say("running the same steps colocated, in one process, to compare...")
    reference = roles.colocated(cfg)
    same = all(r["digests"] == ref for r, ref in zip(table, reference))
    print(
        f"sampler weights equal a colocated{' unsharded' if cfg.trainer_ranks > 1 else ''} run's "
        "at every version, bit for bit: "
        f"{'yes' if same else 'NO'}"
    )
    return 0 if same else 1
