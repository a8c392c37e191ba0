"""weight-teleport as vLLM's trainer-side weight-transfer backend: a trainer written against
vLLM's `WeightTransferTrainerFactory` switches to deltas through a store by naming the
backend in its init info.

    import weight_teleport.targets.vllm_trainer  # registers "weight_teleport" (idempotent)
    from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ModuleSource, WeightTransferTrainerFactory
    info = TeleportTrainerInitInfo("http://origin:8000", PublisherConfig(store=StoreConfig(token=T)), rank=0)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=HTTPVLLMWeightSyncClient(url),
                                                       source=ModuleSource(model))
    report = engine.send_weights()   # after each optimizer step: publish, commit on every engine

The contract is vLLM 0.32's (`vllm/distributed/weight_transfer/base.py`):
- `trainer_init` runs on every trainer rank; rank 0 (`TrainerInitInfo.rank`, given by the
  caller) is the sender, the only rank that calls the clients. It sends each engine the
  worker's init info (`TeleportInitInfo`: the store to follow, the publisher's public key
  as a trusted key when it signs) through `client.init_weight_transfer_engine`.
- `send_weights()` runs on every rank. It publishes the source's tensors as the next
  version with a `Publisher` (the copy on the caller's thread, encode and upload on the
  publisher's, anchors and signing as `PublisherConfig` says), waits until the version is
  in the store, then commits it on every engine through its client: `start_weight_update`,
  `update_weights({"version": V, ...})` (a few bytes: each worker stages the version
  itself from the store), `finish_weight_update(weight_version=str(V))`.
- A source that lends each rank's shards unmaterialized (`ShardedModuleSource`: FSDP2 or
  tensor-parallel DTensors) is published as parts, each rank its own shards, with a
  `PublisherGroup`: no rank gathers the weights. Any other `WeightSource` is iterated on
  every rank as vLLM defines it (DTensors gathered), and the sender publishes it whole.

`client` is one vLLM `VLLMWeightSyncClient` or a list of them, one per engine. The four
calls of that protocol return nothing, so for the engines whose state it can read the
engine reads more: a `VllmServer`, or vLLM's `HTTPVLLMWeightSyncClient` (the same server's
routes), is committed as `VllmServer.commit_version` commits (generation paused, the
workers' outcome read, the prefix and encoder caches reset once applied, the label given
back where not applied), the three weight-update calls made through the client. Any other
client (vLLM's Ray client) gets the three calls alone; its outcome is "UNCONFIRMED" and its
workers warn that nothing reset the engine's prefix cache.

`send_weights` returns a `SyncReport` (also `engine.last_report`): each engine's outcome
and the version it holds. `TeleportTrainerInitInfo.fleet` (`FleetWait`) makes it commit
again on the engines that lag until enough hold the version, or raise `FleetLagging`
(fleet.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import ModuleSource, TrainerInitInfo, TrainerWeightTransferEngine
from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

from weight_teleport.errors import ConfigError
from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.publish import Publisher, PublisherGroup
from weight_teleport.publish.ranks import Ranks
from weight_teleport.targets.fleet import APPLIED, UNCONFIRMED, EngineState, Fleet, FleetLagging, FleetWait, SyncReport
from weight_teleport.targets.vllm_server import VllmServer
from weight_teleport.targets.worker_local import TeleportInitInfo

BACKEND = "weight_teleport"
__all__ = [
    "BACKEND",
    "TeleportTrainerInitInfo",
    "TeleportTrainerEngine",
    "ShardedModuleSource",
    "FleetWait",
    "FleetLagging",
    "SyncReport",
]
_log = logging.getLogger(__name__)


@dataclass
class TeleportTrainerInitInfo(TrainerInitInfo):
    """What the trainer engine publishes to and tells the engines (vLLM's contract: the
    static parameters ride the trainer init info; the sender hands the workers theirs)."""

    backend: ClassVar[str] = BACKEND

    store_url: str
    """The store this trainer publishes to (an origin `http://`, `file://`, `s3://`, ...)."""
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
    """The publisher's settings: anchors, codec, signing key, the store's write token,
    `hints` (`vllm_layout.slice_hints` for engines at TP > 1)."""
    engine_store_url: str | None = None
    """The store the engines follow, where it is not `store_url` (a cache in front)."""
    engine_init: Mapping[str, Any] = field(default_factory=dict)
    """The rest of each engine's `TeleportInitInfo` (wait_s, read_token, initial_version,
    ...). Without `trusted_keys`, a publisher that signs makes its public key the trusted one."""
    fleet: FleetWait | None = None
    """When a version sent counts as delivered (fleet.py); None: one commit round."""
    init_engines: bool = True
    """Send each engine its init info at `trainer_init` (False: the engines follow the
    store already)."""
    group: Any = None
    """The trainer ranks' process group (None: every rank of the job); unused by one process."""

    def __post_init__(self) -> None:
        self.publisher.validate()
        self.worker_init()  # a typo fails here, not in the engines

    def worker_init(self) -> dict:
        """The init info every engine's workers get (`TeleportInitInfo`'s fields, JSON)."""
        init = {"store_url": self.engine_store_url or self.store_url, **self.engine_init}
        if "trusted_keys" not in init and self.publisher.signing_key is not None:
            init["trusted_keys"] = [_public_pem(self.publisher.signing_key)]
        try:
            TeleportInitInfo(**init)
        except TypeError as exc:
            raise ConfigError(f"engine_init: {exc}") from None
        return init


def _public_pem(private_key: bytes | str) -> str:
    """The PEM text of a signing key's public key (JSON carries text, not bytes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from weight_teleport.format.signing import public_key

    raw = public_key(private_key.encode() if isinstance(private_key, str) else private_key)
    return (
        Ed25519PublicKey.from_public_bytes(raw)
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


class ShardedModuleSource(ModuleSource):
    """vLLM's `ModuleSource` (iteration gathers each DTensor, as vLLM's other backends
    need) that also lends this rank's parameters as they are: the weight-teleport engine
    publishes DTensors' local shards as parts, without a gather."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__(module)
        self.module = module

    def local_state(self) -> dict[str, torch.Tensor]:
        """Parameter name -> the parameter (a DTensor stays one), detached."""
        return {name: p.detach() for name, p in self.module.named_parameters()}


def _server_of(client) -> VllmServer | None:
    """The `VllmServer` whose routes read `client`'s engine, where one does."""
    if isinstance(client, VllmServer):
        return client
    if isinstance(client, HTTPVLLMWeightSyncClient):
        return VllmServer(client.base_url, timeout=client.timeout)
    return None


def _name_of(client, i: int) -> str:
    return getattr(client, "url", None) or getattr(client, "base_url", None) or f"engine {i}"


class TeleportTrainerEngine(TrainerWeightTransferEngine[TeleportTrainerInitInfo]):
    """The trainer side of the weight-teleport backend (module docstring); made by
    `WeightTransferTrainerFactory.trainer_init` on every trainer rank."""

    init_info_cls = TeleportTrainerInitInfo

    def __init__(self, *, client, source=None, is_sender: bool = True, info: TeleportTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.info = info
        self.clients = list(client) if isinstance(client, (list, tuple)) else [client]
        self.servers = [_server_of(c) for c in self.clients]
        self.last_report: SyncReport | None = None
        self.version: int | None = None
        """The last version sent."""
        self.publisher: Publisher | None = None
        self.group: PublisherGroup | None = None
        self.ranks: Ranks | None = None
        self.fleet: Fleet | None = None
        held = info.engine_init.get("initial_version")
        if is_sender:
            if info.fleet is not None:
                info.fleet.check(len(self.clients), sum(s is not None for s in self.servers))
            self.fleet = Fleet(
                [EngineState(_name_of(c, i), held) for i, c in enumerate(self.clients)], self._commit, info.fleet
            )

    @classmethod
    def trainer_init(cls, init_info: TeleportTrainerInitInfo, *, client, source=None) -> "TeleportTrainerEngine":
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, info=init_info)
        try:
            engine._open()
            if engine.is_sender and init_info.init_engines:
                worker_init = init_info.worker_init()
                for c in engine.clients:
                    c.init_weight_transfer_engine(worker_init)
        except BaseException:
            engine.shutdown()
            raise
        return engine

    def _open(self) -> None:
        import torch.distributed as dist

        info = self.info
        ranks = dist.get_world_size(info.group) if dist.is_available() and dist.is_initialized() else 1
        if ranks == 1 and not self.is_sender:
            raise ConfigError(
                f"TrainerInitInfo.rank={info.rank} is not the sender, and no torch.distributed group "
                "joins this process to one: a single trainer process is rank 0"
            )
        if ranks > 1:
            self.ranks = Ranks(info.group)
        if ranks > 1 and hasattr(self.source, "local_state"):
            self.group = PublisherGroup(info.store_url, info.publisher, group=info.group, hints=info.publisher.hints)
            if (self.group.rank == 0) != self.is_sender:
                raise ConfigError(
                    f"TrainerInitInfo.rank={info.rank}, but this is rank {self.group.rank} of the "
                    "trainer ranks' group: the sender is the group's rank 0"
                )
        elif self.is_sender:
            self.publisher = Publisher(info.store_url, info.publisher)

    def send_weights(self, state: Mapping[str, torch.Tensor] | None = None) -> SyncReport:
        """Publish `state` (default: the source's tensors) as the next version and commit it
        on every engine (module docstring). Called on every trainer rank; each returns the
        sender's report, or raises `FleetLagging` with it."""
        version = self._publish(state)
        report, error = None, None
        if self.is_sender:
            assert self.fleet is not None
            try:
                report = self.fleet.send(version)
            except FleetLagging as exc:
                report, error = exc.report, str(exc)
        if self.ranks is not None:
            report, error = self.ranks.broadcast((report, error))
        self.version, self.last_report = (version if report is None else report.version), report
        assert report is not None  # the sender's, broadcast to every rank
        if error is not None:
            raise FleetLagging(error, report)
        return report

    def _publish(self, state: Mapping[str, torch.Tensor] | None) -> int:
        """Publish and wait until the version is in the store; its number."""
        if self.group is not None:
            local = dict(state) if state is not None else self.source.local_state()
            return self.group.publish(local).version
        if state is None:
            if self.source is None:
                raise ConfigError("send_weights needs a state, or a WeightSource at trainer_init")
            with torch.no_grad():
                state = {name: t.detach() for name, t in self.source}  # every rank: the gathers are collectives
        if self.publisher is None:  # a rank other than the sender: nothing to publish
            return -1
        return self.publisher.publish(state).wait().version

    def _commit(self, i: int, version: int, wait_s: float | None) -> tuple[str, int | None]:
        """Commit `version` on engine `i` (fleet.Commit)."""
        client, server = self.clients[i], self.servers[i]
        if server is None:  # the protocol's three calls; nothing reads the outcome
            client.start_weight_update()
            client.update_weights({"version": version} | ({} if wait_s is None else {"wait_s": wait_s}))
            client.finish_weight_update(str(version))
            return UNCONFIRMED, None
        outcome = server.commit_version(version, wait_s=wait_s, through=None if client is server else client)
        if outcome == APPLIED:
            return outcome, version
        held = [s["applied"] for s in server.status()]
        return outcome, None if None in held else min(held)

    def engines(self) -> list[dict]:
        """Each engine as the sender knows it (name, held, outcome, error, commits)."""
        return [asdict(e) for e in self.fleet.engines] if self.fleet is not None else []

    def shutdown(self) -> None:
        """Publish what is queued, close the store and the trainer ranks' group; the engines
        keep following the store."""
        try:
            if self.publisher is not None:
                self.publisher.close()
            if self.group is not None:
                self.group.close()
        finally:
            self.publisher = self.group = None
            if self.fleet is not None:
                self.fleet.close()
            if self.ranks is not None:
                self.ranks.close()
                self.ranks = None


def register() -> None:
    """Register the trainer engine with vLLM's trainer factory (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, TeleportTrainerEngine)


register()
