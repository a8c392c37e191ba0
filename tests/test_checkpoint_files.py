"""`publish` carries a checkpoint's side files with every anchor and `pull` writes them
beside model.safetensors: what it writes loads in HF transformers (model and tokenizer)
bit for bit. Side files that do not match the manifest are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from weight_teleport.cli import main
from weight_teleport.pipeline.checkpoint import load_side_files
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.fetch import fetch_side_files
from weight_teleport.pipeline.manifest import from_json
from weight_teleport.store import open_store


def tiny_checkpoint(d: Path, seed: int) -> dict[str, torch.Tensor]:
    """A tiny Qwen3 checkpoint made with save_pretrained, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(d)
    vocab = {w: i for i, w in enumerate(["<unk>", "hello", "world"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(d)
    (d / "model.safetensors.index.json").write_text("{}")      # an index is never carried
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_pull_writes_a_checkpoint_transformers_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    url, ckpt = f"file://{tmp_path}/store", tmp_path / "ckpt"
    states = []
    for v in range(3):
        states.append(tiny_checkpoint(ckpt, seed=v))
        assert main(["publish", str(ckpt), "--to", url, "--anchor-every", "2"]) == 0
    files = load_side_files(ckpt)
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(files)
    assert not any(n.endswith((".safetensors", ".index.json")) for n in files)
    for v in (1, 2):
        out = tmp_path / f"out{v}"
        assert main(["pull", url, "--out", str(out), "--version", str(v)]) == 0
        for name, data in files.items():
            assert (out / name).read_bytes() == data
        model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16)
        got = model.state_dict()
        for k, t in states[v].items():
            assert torch.equal(got[k].view(torch.int16), t.view(torch.int16)), k
        assert AutoTokenizer.from_pretrained(out)("hello world")["input_ids"] == [1, 2]
    with open_store(url) as store:
        manifest = from_json(store.get_manifest())
    assert [len(e.files) for e in manifest.anchors] == [len(files)] * 2
    assert len({f.key for e in manifest.anchors for f in e.files}) == len(files)  # shared
    record = manifest.anchors[-1].files[0]
    (tmp_path / "store" / "objects" / record.key).write_bytes(b"x" * record.size)
    with open_store(url) as store, pytest.raises(ObjectRejected, match=record.name):
        fetch_side_files(store, manifest, 2)
