"""The engine-level half of a weight update in an in-process vLLM engine (`vllm.LLM`).

A vLLM engine derives state from its weights outside the workers, where a weight-transfer
backend cannot reach it: the scheduler's prefix cache maps token prefixes to KV blocks
computed with the weights of the time, and reuses them for every later prompt with that
prefix (full blocks only: 16 tokens on a GPU, 128 on vLLM's CPU backend). The encoder cache
(a multimodal model's encoder outputs) is the same kind of state. vLLM 0.32's
`finish_weight_update` resets neither: after it, a prompt that shares a prefix with an
earlier one is computed partly with the old weights. So a version is applied, at the
engine level, by `commit_version`, which resets both before the engine generates again and
labels the outputs with the version. `VllmTarget.apply` and `load` reset them too
(`reset_weight_caches`); `vllm serve` has the same calls over HTTP (`targets/vllm_server.py`).

What else the engine derives from its weights reads them in place and needs no reset:
CUDA graphs replay kernels on the parameters' own memory, and vLLM's torch.compile graphs
read the parameters when they run (Inductor's `freezing` is off; vLLM's CPU backend turns
it on under `max_autotune`, which attaching refuses, and repacks linear weights for oneDNN,
which `teleport_attach` turns off)."""

from weight_teleport.errors import WeightTeleportError
from weight_teleport.targets.worker_local import group_outcome


class EngineCacheError(WeightTeleportError, RuntimeError):
    """The engine holds state computed with old weights that it would not drop."""


def reset_weight_caches(llm) -> None:
    """Drop every cache `llm` derived from its weights: the prefix cache (running requests
    are preempted and recompute their KV with the new weights; a KV connector's external
    cache too) and the encoder cache."""
    if not llm.reset_prefix_cache(reset_running_requests=True, reset_connector=True):
        raise EngineCacheError(
            "the engine's KV connector refused to reset its cache: prompts may reuse KV "
            "computed with the old weights; reset it before generating "
            "(llm.reset_prefix_cache(reset_connector=True))"
        )
    llm.llm_engine.reset_encoder_cache()


def commit_version(llm, version: int, *, wait_s: float | None = None) -> str:
    """The pause, on a `vllm.LLM` started with the weight-teleport backend: apply `version`
    on every worker or on none (vLLM's `start_weight_update`, `update_weights`,
    `finish_weight_update`). When applied, it also drops the caches derived from the old
    weights (`reset_weight_caches`) and labels what the engine generates from then on with
    `str(version)` (vLLM's `CompletionOutput.weight_versions`), before it returns.

    Returns the group's outcome: "APPLIED"; "SKIPPED" (a worker had not staged it within
    `wait_s`, default the init's: commit it, or a newer version, again later); "RESYNC" (a
    worker failed to stage or verify it: every worker stages again). Nothing changes in the
    engine unless "APPLIED"."""
    info = {"version": version, "resets_caches": True} | ({} if wait_s is None else {"wait_s": wait_s})
    llm.start_weight_update()
    llm.update_weights({"update_info": info})
    llm.finish_weight_update()
    statuses = llm.collective_rpc("teleport_status")
    outcome = group_outcome(statuses, version)
    if outcome is None:
        raise RuntimeError(
            f"the workers report no common outcome for version {version}: {[s['outcomes'][-1:] for s in statuses]}"
        )
    if outcome == "APPLIED":
        reset_weight_caches(llm)
        llm.update_weight_version(str(version))
    return outcome
