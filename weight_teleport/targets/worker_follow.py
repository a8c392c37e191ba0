"""A worker's follower: each engine worker (tensor-parallel rank) follows the store on its
own thread, stages versions against its own parameters while the engine generates, and
posts them on its `StageBoard` for the cross-rank commit (targets/commit.py).

It runs the follow loop every follower runs (`pipeline/follow.py`), so the loop's rules
hold here as for a subscriber: the manifest is read again before every step and refused
while it is malformed, unsigned (with `trusted_keys`) or older than the version applied or
listed before (a rank never follows a store that went back: init the engine's transfer
again to follow a reset); a manifest that lists the version held without the object it
came from resyncs this rank (its pending steps and their posts dropped, the newest anchor
staged); every failure is reported to `monitor` (`health` in `WorkerLocal.status()`).

What is the worker's own: plans start from the version this rank will hold once its
pending steps are applied; a step is the plan's first object staged after them
(`slice_stage.stage_entry`: its chunks fetched and checked there), its chain posted for its
version; at most `max_pending` steps ahead of the last commit, none while held. A failed
stage is posted as failed (the group will refuse that version and every later one: a
resync) and this rank stages nothing more until the group has decided, a vote has begun a
new epoch of the board (it waits for a fresh attempt: targets/commit.py), or a backoff
(RETRY_S, doubling to RETRY_MAX_S) has passed, since a store can be repaired; then it plans
again, avoiding the object that failed here where another path exists. A retry that stages
replaces the failed post."""

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from weight_teleport import threads
from weight_teleport.errors import WeightTeleportError
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.health import SubscriberFailed
from weight_teleport.subscribe.follow import FollowLoop
from weight_teleport.format.manifest import Entry
from weight_teleport.pipeline.plan import Plan
from weight_teleport.store.errors import StoreError
from weight_teleport.targets.commit import StageBoard
from weight_teleport.targets.slice_stage import HeldViews, Step, stage_entry

_log = logging.getLogger(__name__)
STAGE_ERRORS = (WeightTeleportError, StoreError, ValueError, KeyError, IndexError, RuntimeError)
"""What a stage may raise for bad bytes, a bad store or a pack of another model."""
RETRY_S, RETRY_MAX_S = 1.0, 30.0
"""The first wait before a failed step is tried again, and the longest."""
MAX_ERRORS = 100
"""Events kept for `errors` (the oldest are dropped)."""


@dataclass(frozen=True)
class Staged:
    """What staging one version took on this worker."""

    fetched: int
    """Bytes read from the store."""
    fetch_s: float
    """Seconds spent reading them."""
    stage_s: float
    """Seconds the whole stage took (the read included)."""
    patch_bytes: int
    """Memory its patches hold (on the device for a CUDA worker)."""
    at: float
    """Wall-clock time (`time.time()`) it was staged: publish -> ready."""


class WorkerFollower(FollowLoop):
    """Follows `store` for one worker: `params()` gives its parameters (name -> tensor, read
    at each stage: an engine may replace them), in the layout `slices` (checkpoint name ->
    `Slice`); posts to `board`. `trusted_keys`: as `SubscriberConfig.trusted_keys`."""

    RESET_HINT = "init the engine's weight transfer again, at the reset store's version, to follow it"

    def __init__(
        self,
        store,
        params,
        slices,
        board: StageBoard,
        *,
        watch_timeout_s: float = 5.0,
        max_pending: int = 4,
        trusted_keys: Sequence[bytes] = (),
        device_budget: int | None = None,
    ) -> None:
        self.params, self.slices, self.board = params, slices, board
        self.max_pending = max_pending
        self.device_budget = device_budget
        """Bytes of device memory the staged versions' patches may hold (`stage_entry`)."""
        self.views = HeldViews(slices)
        """This worker's slices as views of its parameters, kept between versions."""
        self.chain: list[Step] = []
        """The steps staged and not yet applied, in version order."""
        self.stages: dict[int, Staged] = {}
        """What staging each version took here (metrics)."""
        self.errors: list[str] = []
        """What went wrong (failures, refusals, resyncs), the latest MAX_ERRORS."""
        self._made: dict[int, Entry] = {}
        """The object each version staged here came from (`head_entry`)."""
        self._from_anchor = False
        """This rank resynced: plans start from no weights until an anchor is applied."""
        self._seen = board.state()
        self._epoch = board.epoch
        """The board's epoch when the current attempt began."""
        self._stop, self._hold = threading.Event(), threading.Event()
        # Never gives up: no caller waits on a worker to raise to, and a commit of a version
        # it lacks is skipped; its health says it is failing. An object that failed here is
        # avoided at once where another path exists.
        config = SubscriberConfig(
            watch_timeout_s=watch_timeout_s,
            retry_backoff_s=RETRY_S,
            retry_backoff_max_s=RETRY_MAX_S,
            give_up_after_s=None,
            trusted_keys=tuple(trusted_keys),
        )
        super().__init__(config, store, floor=board.applied, set_aside_after=1, who="worker")
        self._thread = threads.start(self.run, "weight-teleport-worker", self._stop.set)

    def hold(self, on: bool) -> None:
        """Stop staging new versions (on) or go on (off); what is staged stays staged."""
        (self._hold.set if on else self._hold.clear)()

    def close(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    # The loop's primitives.
    # the loop only reads head and head_entry; this follower derives them
    @property
    def head(self) -> int | None:  # type: ignore[override]
        if self.chain:
            return self.chain[-1].version
        return None if self._from_anchor else self.board.applied

    @property
    def head_entry(self) -> Entry | None:  # type: ignore[override]
        head = self.head
        return None if head is None else self._made.get(head)

    @property
    def live_version(self) -> int | None:
        return self.board.applied

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def event(self, message: str, resync: bool = False) -> None:
        _log.log(logging.INFO if resync else logging.DEBUG, "%s", message)
        if len(self.errors) >= MAX_ERRORS:
            del self.errors[0]
        self.errors.append(message)

    def _back_off(self, seconds: float) -> None:
        """Wait `seconds`, or less: until a vote begins a new epoch of the board (it waits for
        a fresh attempt), the group resyncs, or the follower closes."""
        deadline, seen = time.monotonic() + seconds, self.board.state()
        while not self._stop.is_set() and seen[1] == self._seen[1] and seen[2] == self._epoch:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            seen = self.board.wait_change(seen, min(left, 0.2))

    def _give_up(self, error: SubscriberFailed) -> None:
        self.event(str(error))
        self._stop.set()

    def _room(self) -> bool:
        while not self._stop.is_set():
            self._catch_up_with_board()
            if not self._hold.is_set() and len(self.chain) < self.max_pending:
                self._epoch = self._seen[2]
                return True
            self.board.wait_change(self._seen, 0.2)  # hold() is polled: it does not touch the board
        return False

    def _stage(self, plan: Plan) -> None:
        entry, t0 = plan.steps[0], time.perf_counter()
        self._epoch = self.board.epoch
        try:
            step = stage_entry(
                self.store,
                entry,
                self.params(),
                self.slices,
                pending=self.chain,
                device_budget=self.device_budget,
                views=self.views,
            )
        except STAGE_ERRORS as e:
            self.board.fail(entry.version, e, self._epoch)
            self.failures.strike(entry, f"staging version {entry.version} ({entry.key}) failed on this worker: {e}")
            return
        self._made[entry.version] = entry
        self.chain.append(step)
        self.stages[step.version] = Staged(
            step.fetched, step.fetch_s, time.perf_counter() - t0, step.nbytes, time.time()
        )
        self._progressed(entry)
        self.board.put(step.version, tuple(self.chain))

    def _drop_head(self) -> None:
        self.chain, self._from_anchor = [], True
        self.board.withdraw()

    # The board.
    def _catch_up_with_board(self) -> None:
        state = self.board.state()
        applied, resyncs, _ = state
        done = [s for s in self.chain if applied is not None and s.version <= applied]
        if any(s.kind == "snapshot" for s in done):
            self._from_anchor = False  # the weights applied come from an anchor
        # the group refused a version: stage again from what is applied
        self.chain = [] if resyncs != self._seen[1] else self.chain[len(done) :]
        self._made = {v: e for v, e in self._made.items() if applied is None or v >= applied}
        self._seen = state
