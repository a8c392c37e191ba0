"""weight-teleport as a vLLM weight-transfer backend: each worker follows the store and
stages its own slice; the pause is one tiny call, "apply version V", committed across the
tensor-parallel group, then a reset of the engine's caches derived from the old weights.

    from vllm import LLM
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION, commit_version
    llm = LLM(model=path, weight_transfer_config={"backend": BACKEND},
              worker_extension_cls=WORKER_EXTENSION, ...)
    llm.init_weight_transfer_engine({"init_info": {"store_url": "http://origin:8000"}})
    ...  # every worker stages the versions it finds, while the engine generates
    commit_version(llm, 7)   # the pause: "APPLIED", "SKIPPED" or "RESYNC"

`commit_version` (targets/vllm_engine.py) is vLLM's `start_weight_update`,
`update_weights({"update_info": {"version": 7}})` (< 64 bytes of RPC) and
`finish_weight_update`, then, once applied, the engine-level calls a worker cannot make:
the prefix and encoder caches are reset (vLLM 0.32 keeps KV computed with the old weights
otherwise, and reuses it for every prompt sharing a full KV block of prefix) and the
engine's outputs are labelled with the version (`CompletionOutput.weight_versions`). A
caller driving vLLM's three calls itself must make those calls too; each worker warns when
a version is applied by an update that does not say so (`VllmUpdateInfo.resets_caches`).

`init` = follow a store URL: each worker (its own thread, `targets/worker_follow.py`) reads
the manifest, fetches the header and only the chunk byte ranges of its slices, and stages
them against its own parameters in vLLM's layout (`targets/slice_stage.py`,
`targets/vllm_layout.py`), each chunk checked against its chunk digests: no full copy of the
model anywhere. The publisher cuts packs at the ranks' slice bounds
(`PublisherConfig.hints = slice_hints(config, tp_sizes)`, or the same `hints` of a
`PublisherGroup`, whose versions of parts a worker reads from the parts that overlap its
slices alone; format version 2); a pack not cut
for a worker's slice fails its stage there (the group refuses it) unless the worker holds
the whole tensor (TP=1, replicated tensors).

`update` = apply version V: `commit` (targets/commit.py) on every rank over vLLM's own TP
CPU group: all ranks apply V or none. It does not raise when none does: vLLM 0.32's
multiprocess executor returns on the first worker's failure and leaves the other workers'
replies queued, so the next call of any kind would read a stale reply. The outcome
(applied; skipped: a rank lagged, commit V again later; resync: a rank failed, every rank
drops what it staged and stages again) is logged and kept.

`vllm serve --weight-transfer-config '{"backend": "weight_teleport"}' --worker-extension-cls
weight_teleport.targets.vllm_backend.TeleportBackendExtension` reaches the same calls through
its HTTP routes (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`, `/reset_prefix_cache`, ...), which `VllmServer.commit_version`
(targets/vllm_server.py) drives in order, generation paused. The backend is registered in
each worker when this module is imported: by `worker_extension_cls` naming the extension
below.

What the weight-transfer API cannot carry stays in the worker extension, because its calls
return nothing to the caller: the outcome of each commit and the workers' state
(`teleport_status`), holding a worker's staging (`teleport_hold`), the parameters for checks
(`teleport_local_weights`), and on vLLM's CPU backend, which repacks linear weights for
oneDNN, the switch to plain, patchable weights (`teleport_attach`, needs the worker).

Fused-MoE models (`vllm_layout`: Qwen3-MoE, Qwen2-MoE, Mixtral) are mapped with tensor
parallelism and with expert parallelism (`enable_expert_parallel`) on one data-parallel
rank, without EPLB, on the backends whose stacked expert parameters keep the loader's
layout; on vLLM's CPU backend, whose MoE kernel reads a prepacked copy, each worker stages
against plain copies and packs them again in the commit (`targets/vllm_moe_cpu.py`). Other
configurations are refused when the engine starts."""

import logging
from dataclasses import dataclass

import torch

from weight_teleport.targets.commit import Outcome
from weight_teleport.targets.vllm import TeleportWorkerExtension, _tensor_bytes
from weight_teleport.targets.vllm_engine import commit_version
from weight_teleport.targets.vllm_layout import UnsupportedLayoutError, expert_range, worker_slices
from weight_teleport.targets.vllm_fp8 import check_fp8_layers
from weight_teleport.targets.vllm_moe_cpu import CpuPackedExperts, check_moe_layers, moe_layers
from weight_teleport.targets.worker_local import TeleportInitInfo, TeleportUpdateInfo, WorkerLocal

BACKEND = "weight_teleport"
WORKER_EXTENSION = "weight_teleport.targets.vllm_backend.TeleportBackendExtension"
__all__ = [
    "BACKEND",
    "WORKER_EXTENSION",
    "TeleportInitInfo",
    "VllmUpdateInfo",
    "TeleportTransferEngine",
    "commit_version",
]
_log = logging.getLogger(__name__)


@dataclass
class VllmUpdateInfo(TeleportUpdateInfo):
    resets_caches: bool = False
    """The caller resets the engine's caches derived from the weights once the version is
    applied, before the engine generates again (`commit_version` and `VllmServer` do).
    False: a worker that applies the version warns that the engine's prefix cache still
    holds KV computed with the old weights."""


def _engine_base():
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    return WeightTransferEngine


class TeleportTransferEngine(_engine_base()):  # type: ignore[misc]  # vLLM's base, imported with this module
    """One per vLLM worker, made by vLLM's `WeightTransferEngineFactory`: vLLM's calls on
    a `WorkerLocal` (targets/worker_local.py)."""

    init_info_cls = TeleportInitInfo
    update_info_cls = VllmUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        from vllm.distributed import get_tp_group

        super().__init__(config, vllm_config, device, model)
        group = get_tp_group()
        tp, rank = group.world_size, group.rank_in_group
        parallel = vllm_config.parallel_config
        ep = bool(parallel.enable_expert_parallel) and tp > 1
        slices = worker_slices(vllm_config.model_config.hf_config, tp, rank, ep)
        check_fp8_layers(model)
        self.packed: CpuPackedExperts | None = None
        if layers := moe_layers(model):
            if parallel.data_parallel_size > 1:
                raise UnsupportedLayoutError(
                    "a fused-MoE model with data parallelism: vLLM spreads its experts over "
                    "the DP x TP ranks, the layout maps one DP rank"
                )
            if parallel.enable_eplb:
                raise UnsupportedLayoutError("a fused-MoE model with EPLB: its experts move between ranks")
            check_moe_layers(model, {n: expert_range(m.global_num_experts, tp, rank, ep) for n, m in layers.items()})
            if torch.device(device).type == "cpu":
                self.packed = CpuPackedExperts(model) or None
        self.worker = WorkerLocal(
            self._params,
            slices,
            rank,
            group.cpu_group,
            torch.device(device),
            after_apply=self.packed.repack if self.packed else None,
        )

    def init_transfer_engine(self, init_info: TeleportInitInfo) -> None:
        """Start following `init_info.store_url` on this worker (again: from scratch)."""
        self.worker.start(init_info)

    def _params(self) -> dict[str, torch.Tensor]:
        params = {n: p.data for n, p in self.model.named_parameters()}
        if self.packed is not None:  # vLLM's CPU MoE kernel reads a prepacked copy: stage the plain one
            params.update(self.packed.plain())
        return params

    def start_weight_update(self) -> None:
        """Patches are applied in place: nothing to prepare."""

    def finish_weight_update(self) -> None:
        """Patches are applied in place: nothing to finalize here. The caches derived from
        the old weights live in the engine core, out of a worker's reach: the caller resets
        them (`commit_version`)."""

    def update_weights(self, update_info: dict) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: VllmUpdateInfo) -> None:
        outcome = self.worker.commit(update_info)
        if outcome is Outcome.APPLIED and not update_info.resets_caches and self.worker.rank == 0:
            _log.warning(
                "version %d is applied, but the engine's prefix cache still holds KV computed with "
                "the old weights: reset it before generating (commit_version, VllmServer, or "
                "llm.reset_prefix_cache after finish_weight_update)",
                update_info.version,
            )

    def shutdown(self) -> None:
        self.worker.shutdown()


class TeleportBackendExtension(TeleportWorkerExtension):
    """Mixed into each vLLM worker (worker_extension_cls): calls the weight-transfer API lacks."""

    weight_transfer_engine: TeleportTransferEngine  # the vLLM worker's (an annotation only)

    def teleport_hold(self, ranks: list[int], on: bool) -> None:
        """Stop (on) or restart (off) staging on the workers of TP ranks `ranks`."""
        worker = self.weight_transfer_engine.worker
        if worker.rank in ranks:
            worker.hold(on)

    def teleport_status(self) -> dict:
        return self.weight_transfer_engine.worker.status()

    def teleport_plain_experts(self) -> dict[str, list]:
        """On vLLM's CPU backend, the plain copies of the prepacked fused-MoE parameters that
        this worker stages against, as `teleport_local_weights` gives parameters (for checks)."""
        packed = self.weight_transfer_engine.packed
        return (
            {}
            if packed is None
            else {
                n: [str(t.dtype).removeprefix("torch."), list(t.shape), _tensor_bytes(t)]
                for n, t in packed.plain().items()
            }
        )


def register() -> None:
    """Register the backend with vLLM's factories (idempotent; the entry point calls it):
    this worker engine, and the trainer engine by module path (`vllm_trainer.py`, imported
    when a trainer asks for it)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, TeleportTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, "weight_teleport.targets.vllm_trainer", "TeleportTrainerEngine"
        )


register()
