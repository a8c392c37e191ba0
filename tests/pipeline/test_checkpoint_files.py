"""`publish` carries a checkpoint's side files with every anchor and `pull` writes them
beside model.safetensors: what it writes loads in HF transformers (model and tokenizer)
bit for bit. Side files that do not match the manifest are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from weight_teleport.cli import main
from weight_teleport.publish.checkpoint import load_side_files
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.fetch import fetch_side_files
from weight_teleport.format.manifest import from_json
from weight_teleport.store import open_store


def tiny_checkpoint(d: Path, seed: int) -> dict[str, torch.Tensor]:
    """A tiny Qwen3 checkpoint made with save_pretrained, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(d)
    vocab = {w: i for i, w in enumerate(["<unk>", "hello", "world"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(d)
    (d / "model.safetensors.index.json").write_text("{}")  # an index is never carried
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


def _version_of(path: Path) -> int | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return int(f.metadata()["weight_teleport_version"])
    except (OSError, KeyError, TypeError, ValueError):  # not written yet
        return None


def _config_of(directory: Path) -> int | None:
    try:
        return json.loads((directory / "config.json").read_text())["version"]
    except (OSError, ValueError):  # not written yet
        return None


def test_pull_follow_keeps_a_checkpoint_at_the_newest_version(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file, save_file

    url, ckpt, out = f"file://{tmp_path}/store", tmp_path / "ckpt", tmp_path / "out"
    ckpt.mkdir()
    g = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(64, 64, generator=g).to(torch.bfloat16)}

    def publish(version: int) -> None:
        weights["w"].view(-1)[version::97] += 1
        save_file(weights, str(ckpt / "model.safetensors"))
        (ckpt / "config.json").write_text(json.dumps({"version": version}))
        assert main(["publish", str(ckpt), "--to", url, "--anchor-every", "2"]) == 0

    def written(version: int, config: int) -> bool:
        """Wait until OUT holds `version`'s weights and version `config`'s config.json."""
        deadline = time.monotonic() + 300
        while (_version_of(out / "model.safetensors"), _config_of(out)) != (version, config):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, (_version_of(out / "model.safetensors"), _config_of(out))
            time.sleep(0.1)
        return torch.equal(
            load_file(str(out / "model.safetensors"))["w"].view(torch.int16), weights["w"].view(torch.int16)
        )

    publish(0)
    publish(1)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "weight_teleport.cli", "pull", url, "--out", str(out), "--follow"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert written(1, config=0)  # side files go with anchors: version 0's
        publish(2)  # a delta and an anchor, with a new config.json
        assert written(2, config=2)
        publish(3)  # a delta
        assert written(3, config=2)
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.stderr.read()
    assert proc.wait(60) == 0 and f"{out} holds version 3" in err, err
