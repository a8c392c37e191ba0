"""TRL's GRPO trainer with its weight sync through weight-teleport: the trainer publishes
each step's weights to a store as versions (an anchor, then deltas) and commits them on a
`vllm serve` sampler started with the backend; generation goes to that server as TRL's
server mode sends it.

    from weight_teleport.integrations.trl import TeleportGRPOTrainer
    from weight_teleport.targets.vllm_trainer import TeleportTrainerInitInfo
    trainer = TeleportGRPOTrainer(
        model=model, reward_funcs=reward, train_dataset=data,
        args=GRPOConfig(use_vllm=True, vllm_mode="server", vllm_server_base_url=SERVER, ...),
        teleport=TeleportTrainerInitInfo("http://origin:8000", PublisherConfig(...), rank=0))
    trainer.train()

The sampler is `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config
'{"backend": "weight_teleport"}' --worker-extension-cls
weight_teleport.targets.vllm_backend.TeleportBackendExtension` (TRL's `VLLMClient` reads the
server's config and world size through the development routes, as it does for NCCL).

How TRL (1.16) syncs, and the hook: in server mode `GRPOTrainer` builds a
`trl.generation.vllm_generation.VLLMGeneration`, which makes a `VLLMClient` on the main
process and calls `init_communicator(device)` (a vLLM NCCL weight-transfer group, CUDA
only), then before each step's generation `sync_weights()`, which calls
`update_named_params(metadata, named_params)` (vLLM's `/start_weight_update`,
`/update_weights` with the tensors broadcast over NCCL, `/finish_weight_update`) and
`reset_prefix_cache()`. `TeleportVLLMClient` is that client with those two methods
replaced: `init_communicator` builds the weight-teleport trainer engine through vLLM's
`WeightTransferTrainerFactory` (targets/vllm_trainer.py) over an `HTTPVLLMWeightSyncClient`
of the same server, and `update_named_params` copies the named tensors TRL yields and calls
`send_weights(state)`: the version is published, then committed on the server. Generation
and everything else are TRL's. `TeleportGRPOTrainer` is `GRPOTrainer` whose constructor
makes TRL build this client (the module's `VLLMClient` name is swapped for the duration of
the constructor alone); nothing else of TRL changes.

Contracts:
- One trainer process (`accelerate` with one process): TRL calls the client on the main
  process alone, and the engine publishes whole tensors from it. With several processes the
  other ranks never call the engine, so it refuses to start rather than hang.
- `update_named_params` copies each tensor as TRL yields it (ZeRO-3 frees a gathered
  parameter once its context exits): one host copy of the model per sync, before the
  publisher's own.
- After `sync_weights` returns, the sampler holds the version sent where the engine's
  `FleetWait` says so (default here `FleetWait(max_lag=0)`: the server applied it, or
  `FleetLagging` is raised and training stops); `trainer.teleport_report` is the last
  `SyncReport`.
- The weights the sampler receives are the trainer's parameters as they are, in their
  dtype: the server must load the model in the same dtype (train in bf16, serve bf16)."""

from __future__ import annotations

import atexit
import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from trl import GRPOTrainer
from trl.generation import vllm_generation
from trl.generation.vllm_client import VLLMClient

from weight_teleport.errors import ConfigError
from weight_teleport.targets.fleet import FleetWait, SyncReport
from weight_teleport.targets.vllm_trainer import TeleportTrainerEngine, TeleportTrainerInitInfo

__all__ = ["TeleportGRPOTrainer", "TeleportVLLMClient", "client_class"]
_log = logging.getLogger(__name__)


class TeleportVLLMClient(VLLMClient):
    """TRL's `VLLMClient` whose weight sync publishes versions and commits them with the
    weight-teleport trainer engine (module docstring). `teleport` is the engine's init
    info; `client_class(info)` binds it for TRL, which constructs the client itself."""

    teleport: TeleportTrainerInitInfo

    def __init__(self, *args: Any, teleport: TeleportTrainerInitInfo | None = None, **kwargs: Any) -> None:
        if teleport is not None:
            self.teleport = teleport
        if getattr(self, "teleport", None) is None:
            raise ConfigError("TeleportVLLMClient needs the trainer engine's TeleportTrainerInitInfo")
        self.engine: TeleportTrainerEngine | None = None
        self.last_report: SyncReport | None = None
        self._pending: dict[str, torch.Tensor] | None = None
        super().__init__(*args, **kwargs)

    def init_communicator(self, device: torch.device | str | int = 0) -> None:
        """Build the trainer engine (it sends the server its init info: the store to
        follow); no NCCL group, so any device does."""
        import torch.distributed as dist
        from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, WeightTransferTrainerFactory

        if self.get_server_info()["weight_transfer_config"] is None:
            raise ConfigError(
                f"the vLLM server at {self.base_url} has no weight-transfer engine: start it with "
                """--weight-transfer-config '{"backend": "weight_teleport"}' and the worker """
                "extension weight_teleport.targets.vllm_backend.TeleportBackendExtension"
            )
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.teleport.group) > 1:
            raise ConfigError(
                "TeleportVLLMClient supports one trainer process: TRL calls the weight sync on the "
                "main process alone, so the other ranks would never join the engine's group"
            )
        self.engine = WeightTransferTrainerFactory.trainer_init(
            self.teleport, client=HTTPVLLMWeightSyncClient(self.base_url)
        )
        atexit.register(self.close_communicator)

    @contextmanager
    def weight_update(self) -> Iterator[None]:
        """The tensors of every `update_named_param(s)` call inside make one version."""
        self._pending = {}
        self._updating_weights = True
        try:
            yield
            pending = self._pending
        finally:
            self._updating_weights = False
            self._pending = None
        self._send(pending)

    def update_named_params(
        self, metadata: list[tuple[str, str, list[int]]], named_params: Iterator[tuple[str, torch.Tensor]]
    ) -> None:
        """Copy the tensors TRL yields (`metadata` is TRL's announcement for NCCL; the
        store's manifest carries names, dtypes and shapes) and send them as one version,
        or add them to the `weight_update` block's version."""
        state = {name: t.detach().to("cpu", copy=True) for name, t in named_params}
        if self._pending is not None:
            self._pending.update(state)
        else:
            self._send(state)

    def _send(self, state: dict[str, torch.Tensor]) -> None:
        if self.engine is None:
            raise ConfigError("init_communicator was not called: the trainer engine does not exist")
        report = self.engine.send_weights(state)
        self.last_report = report
        _log.info("weight sync: %s", report.describe())

    def close_communicator(self) -> None:
        """Publish what is queued and close the store; the server keeps following it."""
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()


def client_class(teleport: TeleportTrainerInitInfo) -> type[TeleportVLLMClient]:
    """A `TeleportVLLMClient` subclass bound to `teleport`, for TRL to construct as it
    constructs `VLLMClient` (base URL, group port, timeout)."""
    return type("BoundTeleportVLLMClient", (TeleportVLLMClient,), {"teleport": teleport})


@contextmanager
def _trl_builds(cls: type[VLLMClient]) -> Iterator[None]:
    """TRL's `VLLMGeneration` constructs `cls` in place of `VLLMClient` while inside."""
    saved = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = cls
    try:
        yield
    finally:
        vllm_generation.VLLMClient = saved


class TeleportGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` in vLLM server mode, its weight sync through weight-teleport.
    `teleport` is the trainer engine's init info; without a `FleetWait` it gets
    `FleetWait(max_lag=0)`: each sync returns once the server applied the version."""

    def __init__(self, *args: Any, teleport: TeleportTrainerInitInfo, **kwargs: Any) -> None:
        args_ = kwargs.get("args") if "args" in kwargs else (args[2] if len(args) > 2 else None)
        if args_ is None or not getattr(args_, "use_vllm", False) or args_.vllm_mode != "server":
            raise ConfigError("TeleportGRPOTrainer needs GRPOConfig(use_vllm=True, vllm_mode='server', ...)")
        if teleport.fleet is None:
            teleport = dataclasses.replace(teleport, fleet=FleetWait(max_lag=0))
        with _trl_builds(client_class(teleport)):
            super().__init__(*args, **kwargs)

    @property
    def teleport_client(self) -> TeleportVLLMClient:
        client = self.vllm_generation.vllm_client
        assert isinstance(client, TeleportVLLMClient)
        return client

    @property
    def teleport_report(self) -> SyncReport | None:
        """The last sync's `SyncReport` (every engine's outcome and the version it holds)."""
        return self.teleport_client.last_report
