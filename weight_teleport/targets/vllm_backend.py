"""weight-teleport as a vLLM weight-transfer backend: each worker stages its own slice, the
pause is one tiny call, "apply version V", committed across the tensor-parallel group.

    from vllm import LLM
    from weight_teleport.targets.vllm_backend import BACKEND, WORKER_EXTENSION
    llm = LLM(model=path, weight_transfer_config={"backend": BACKEND},
              worker_extension_cls=WORKER_EXTENSION, ...)
    llm.init_weight_transfer_engine({"init_info": {"wait_s": 30}})
    ...  # versions are staged on every worker, outside the pause
    llm.start_weight_update()
    llm.update_weights({"update_info": {"version": 7}})   # the pause: < 100 bytes of RPC
    llm.finish_weight_update(weight_version="7")

`vllm serve --weight-transfer-config '{"backend": "weight_teleport"}'` reaches the same
calls through its HTTP routes (`/init_weight_transfer_engine`, `/start_weight_update`,
`/update_weights`, `/finish_weight_update`). The backend is registered in each worker when
this module is imported: by the `vllm.general_plugins` entry point of an installed
weight-teleport, or by `worker_extension_cls` naming the extension below.

`update_weights` runs `commit` (targets/commit.py) on every rank over vLLM's own TP CPU
group: all ranks apply V or none. It does not raise when none does: vLLM 0.32's
multiprocess executor returns on the first worker's failure and leaves the other workers'
replies queued, so the next call of any kind would read a stale reply. The outcome
(applied, skipped: a rank lagged, commit V again later; resync) is logged and kept.

What the weight-transfer API cannot carry stays in the worker extension, because its calls
return nothing to the caller: the outcome of each commit and the workers' state
(`teleport_status`), staging pushed by a driver (`teleport_stage`, outside the pause) and
the parameters for checks (`teleport_local_weights`)."""

import logging
from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.errors import PackMismatchError, WeightTeleportError
from weight_teleport.targets.commit import Outcome, StageBoard, commit
from weight_teleport.targets.slice_view import scatter_walk
from weight_teleport.targets.vllm import TeleportWorkerExtension
from weight_teleport.targets.vllm_layout import Slice, worker_slices

BACKEND = "weight_teleport"
WORKER_EXTENSION = "weight_teleport.targets.vllm_backend.TeleportBackendExtension"
_log = logging.getLogger(__name__)


@dataclass
class TeleportInitInfo:
    wait_s: float = 30.0
    """How long `update_weights` waits for a worker's own stage of the version before
    voting; a worker still staging then makes the group skip the version."""


@dataclass
class TeleportUpdateInfo:
    version: int
    wait_s: float | None = None
    """Overrides the init's `wait_s` for this call."""


@dataclass(frozen=True)
class _Write:
    slice: Slice
    positions: torch.Tensor
    bits: torch.Tensor


def _engine_base():
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    return WeightTransferEngine


class TeleportTransferEngine(_engine_base()):
    """One per vLLM worker, made by vLLM's `WeightTransferEngineFactory`."""

    init_info_cls = TeleportInitInfo
    update_info_cls = TeleportUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        from vllm.distributed import get_tp_group

        super().__init__(config, vllm_config, device, model)
        group = get_tp_group()
        self.rank, self.group = group.rank_in_group, group.cpu_group
        self.slices = worker_slices(vllm_config.model_config.hf_config, group.world_size, self.rank)
        self.board = StageBoard()
        self.outcomes: list[tuple[int, str]] = []
        self._wait_s: float | None = None

    def init_transfer_engine(self, init_info: TeleportInitInfo) -> None:
        self._wait_s = init_info.wait_s

    def start_weight_update(self) -> None:
        """Patches are applied in place: nothing to prepare."""

    def finish_weight_update(self) -> None:
        """Patches are applied in place: nothing to finalize."""

    def update_weights(self, update_info: dict) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: TeleportUpdateInfo) -> None:
        if self._wait_s is None:
            raise RuntimeError("call init_weight_transfer_engine before update_weights")
        wait_s = self._wait_s if update_info.wait_s is None else update_info.wait_s
        outcome = commit(update_info.version, self.board, self._apply, group=self.group, wait_s=wait_s)
        self.outcomes.append((update_info.version, outcome.name))
        if outcome is not Outcome.APPLIED:
            why = ("a worker has not staged it yet; commit it again later" if outcome is Outcome.SKIPPED
                   else "a worker failed to stage or verify it; the group resyncs")
            _log.warning("version %d was applied on no worker: %s", update_info.version, why)

    def stage(self, version: int, writes: list) -> None:
        """Stage `version` on this worker from (checkpoint name, walk positions int64 bytes,
        new bit patterns bytes) triples; a triple that does not fit this worker's slices
        fails the version here, so the group will not apply it."""
        try:
            self.board.put(version, [self._checked(*w) for w in writes])
        except (WeightTeleportError, ValueError, KeyError, IndexError) as e:
            self.board.fail(version, e)

    def _checked(self, name: str, positions: bytes, bits: bytes) -> _Write:
        s = self.slices[name]
        param = dict(self.model.named_parameters())[s.param]
        pos = torch.from_numpy(np.frombuffer(positions, dtype="<i8").copy())
        width = param.element_size()
        val = torch.from_numpy(np.frombuffer(bits, dtype=f"<i{width}").copy())
        start, stop = s.walk
        if pos.numel() != val.numel() or (pos.numel() and (int(pos.min()) < start or int(pos.max()) >= stop)):
            raise PackMismatchError(f"{name!r}: a staged write lies outside this worker's slice")
        return _Write(s, pos.to(param.device), val.to(param.device))

    def _apply(self, writes: list[_Write]) -> None:
        params = dict(self.model.named_parameters())
        for w in writes:
            scatter_walk(params[w.slice.param].data, w.slice, w.positions, w.bits)

    def status(self) -> dict:
        return {"rank": self.rank, "applied": self.board.applied, "outcomes": self.outcomes,
                "resync_requested": self.board.resync_requested}

    def shutdown(self) -> None:
        self._wait_s = None


class TeleportBackendExtension(TeleportWorkerExtension):
    """Mixed into each vLLM worker (worker_extension_cls): calls the weight-transfer API lacks."""

    def teleport_stage(self, version: int, writes_by_rank: dict) -> None:
        """Stage `version` from this rank's entry of `writes_by_rank` (keyed by TP rank as
        a string); a rank without an entry stages nothing (it lags)."""
        engine = self.weight_transfer_engine
        if str(engine.rank) in writes_by_rank:
            engine.stage(version, writes_by_rank[str(engine.rank)])

    def teleport_status(self) -> dict:
        return self.weight_transfer_engine.status()


def register() -> None:
    """Register the backend with vLLM's factory (idempotent; the entry point calls it)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, TeleportTransferEngine)


register()
