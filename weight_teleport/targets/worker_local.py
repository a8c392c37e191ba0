"""One engine worker's side of worker-local staging, independent of the engine: what the
vLLM backend (`targets/vllm_backend.py`) and the SGLang loader (`targets/sglang.py`) share.

A `WorkerLocal` lives in each tensor-parallel worker. `start` follows a store on the
worker's own thread (`worker_follow.py`: fetch the chunks of its slices, stage them against
its own parameters); `commit(V)` is the pause: the cross-rank vote and apply of
`targets/commit.py` over the TP group's CPU process group. It never raises for an outcome
(engines answer their callers before every worker's reply is in, or die on an exception
in a weight update): the outcome is logged and kept in `status()`, beside the follower's
health, which tells the host when a worker is failing."""

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from weight_teleport.store import StoreConfig, open_store
from weight_teleport.targets.commit import Outcome, StageBoard, commit
from weight_teleport.targets.slice_stage import apply_steps, warm_up
from weight_teleport.targets.vllm_layout import Slice
from weight_teleport.targets.worker_follow import WorkerFollower

_log = logging.getLogger(__name__)


STATUS_FIELDS = (
    ("fetched", "fetched"),
    ("fetch_s", "fetch_s"),
    ("stage_s", "stage_s"),
    ("patch_bytes", "patch_bytes"),
    ("staged_at", "at"),
)
"""(status key, `worker_follow.Staged` field): per staged version, in `WorkerLocal.status()`."""


@dataclass
class TeleportInitInfo:
    store_url: str
    """The store every worker follows (file://, http(s)://, s3://, ...)."""
    initial_version: int | None = None
    """The version the engine loaded (its checkpoint); None: unknown, start from an anchor."""
    wait_s: float = 30.0
    """How long a commit waits for a worker's own stage of the version before voting; a
    worker still staging then makes the group skip the version."""
    watch_timeout_s: float = 5.0
    """Long-poll of the manifest, per request."""
    max_pending: int = 4
    """Versions a worker stages ahead of the last commit, at most."""
    read_token: str | None = None
    """The store's read token, where it has one."""
    device_staged_bytes: int | None = None
    """On a CUDA worker: bytes of device memory the staged versions' patches may hold
    together; beyond it they move to pinned host memory (a longer pause). None: no bound."""
    trusted_keys: Sequence[str | bytes] = ()
    """Ed25519 public keys (PEM text, or bytes as `SubscriberConfig.trusted_keys` takes
    them) whose manifest signatures are accepted (`PublisherConfig.signing_key`). Non-empty:
    every worker refuses a manifest that none of them signed."""


@dataclass
class TeleportUpdateInfo:
    version: int
    wait_s: float | None = None
    """Overrides the init's `wait_s` for this call."""


class WorkerLocal:
    """Worker-local staging for TP rank `rank` of `group` (a CPU process group; None: the
    default group): `params()` gives its parameters by name (read at each stage and apply:
    an engine may replace them), held as `slices` (checkpoint name -> `Slice`) describe.
    `after_apply`: called once a version is written, inside the commit, on every rank that
    applied it (an engine's tensors derived from the parameters are made again there)."""

    def __init__(
        self,
        params: Callable[[], Mapping[str, torch.Tensor]],
        slices: Mapping[str, Slice],
        rank: int,
        group,
        device: torch.device,
        after_apply: Callable[[], None] | None = None,
    ) -> None:
        self.params, self.slices, self.rank, self.group, self.device = params, slices, rank, group, device
        self.after_apply = after_apply
        self.board = StageBoard()
        self.outcomes: list[tuple[int, str]] = []
        self.apply_s: dict[int, float] = {}
        """Seconds this worker spent writing each applied version (its own scatter)."""
        self.follower: WorkerFollower | None = None
        self._wait_s: float | None = None

    def start(self, info: TeleportInitInfo) -> None:
        """Start following `info.store_url` on this worker (again: from scratch)."""
        self.shutdown()
        self.board = StageBoard()
        self.board.applied = info.initial_version
        store = open_store(info.store_url, StoreConfig(read_token=info.read_token))
        if self.device.type == "cuda":
            warm_up(self.device, {p.dtype for p in self.params().values()})
        keys = tuple(k.encode() if isinstance(k, str) else k for k in info.trusted_keys)
        self.follower = WorkerFollower(
            store,
            self.params,
            self.slices,
            self.board,
            watch_timeout_s=info.watch_timeout_s,
            max_pending=info.max_pending,
            trusted_keys=keys,
            device_budget=info.device_staged_bytes,
        )
        self._wait_s = info.wait_s

    def commit(self, update: TeleportUpdateInfo) -> Outcome:
        """Apply `update.version` on every rank of the group or on none; call on every rank."""
        if self._wait_s is None:
            raise RuntimeError("start following a store (init) before committing a version")
        wait_s = self._wait_s if update.wait_s is None else update.wait_s
        outcome = commit(update.version, self.board, self._apply, group=self.group, wait_s=wait_s)
        self.outcomes.append((update.version, outcome.name))
        if outcome is not Outcome.APPLIED:
            why = (
                "a worker has not staged it yet; commit it again later"
                if outcome is Outcome.SKIPPED
                else "a worker failed to stage or verify it; the group resyncs"
            )
            _log.warning("version %d was applied on no worker: %s", update.version, why)
        return outcome

    def _apply(self, steps) -> None:
        assert self.follower is not None  # `commit` runs only between `start` and `shutdown`
        applied, t0 = self.board.applied, time.perf_counter()
        apply_steps(self.params(), [st for st in steps if applied is None or st.version > applied], self.follower.views)
        if self.after_apply is not None:
            self.after_apply()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.apply_s[steps[-1].version] = time.perf_counter() - t0

    def hold(self, on: bool) -> None:
        """Stop (on) or restart (off) staging new versions on this worker."""
        if self.follower is not None:
            self.follower.hold(on)

    def status(self) -> dict:
        f = self.follower
        return {
            "rank": self.rank,
            "applied": self.board.applied,
            "outcomes": self.outcomes,
            "resyncs": self.board.resyncs,
            "staged": [s.version for s in f.chain] if f else [],
            "apply_s": dict(self.apply_s),
            **{key: {v: getattr(s, field) for v, s in (f.stages.items() if f else ())} for key, field in STATUS_FIELDS},
            "errors": list(f.errors) if f else [],
            "health": dataclasses.asdict(f.monitor.health) if f else None,
        }

    def shutdown(self) -> None:
        if self.follower is not None:
            self.follower.close()
        self.follower, self._wait_s = None, None


def group_outcome(statuses: list[dict], version: int) -> str | None:
    """The outcome of committing `version` ("APPLIED", "SKIPPED", "RESYNC"), from every
    rank's `status()` after the commit; None unless every rank's latest commit was
    `version` with one outcome."""
    latest = {tuple(s["outcomes"][-1]) if s["outcomes"] else None for s in statuses}
    only = latest.pop() if len(latest) == 1 else None
    if only is None:
        return None
    committed, outcome = only
    return outcome if committed == version else None
