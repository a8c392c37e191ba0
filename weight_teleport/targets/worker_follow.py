"""A worker's follower: each engine worker (tensor-parallel rank) follows the store on its
own thread, stages versions against its own parameters while the engine generates, and
posts them on its `StageBoard` for the cross-rank commit (targets/commit.py).

Loop: read the manifest (long-polls), plan from the version this rank will hold once its
pending steps are applied (`pipeline.plan.plan_avoiding`), stage the plan's first object
(`slice_stage.stage_entry`), post the chain of pending steps for its version, repeat; at
most `max_pending` steps ahead of the last commit. A failed stage is posted as failed (the
group will refuse that version and every later one: a resync) and this rank stages nothing
more until the group has decided, a vote has begun a new epoch of the board (it waits for a
fresh attempt: targets/commit.py), or a backoff (RETRY_S, doubling to RETRY_MAX_S) has
passed, since a store can be repaired; then it plans again, avoiding the object that failed
here where another path exists. A retry that stages replaces the failed post."""

import logging
import threading
import time
from dataclasses import dataclass

from weight_teleport import threads
from weight_teleport.errors import WeightTeleportError
from weight_teleport.pipeline.errors import NoPlanError
from weight_teleport.pipeline.manifest import Manifest, from_json
from weight_teleport.pipeline.plan import plan_avoiding
from weight_teleport.store import manifest_etag
from weight_teleport.store.errors import StoreError
from weight_teleport.targets.commit import StageBoard
from weight_teleport.targets.slice_stage import HeldViews, Step, stage_entry

_log = logging.getLogger(__name__)
STAGE_ERRORS = (WeightTeleportError, StoreError, ValueError, KeyError, IndexError, RuntimeError)
"""What a stage may raise for bad bytes, a bad store or a pack of another model."""
RETRY_S, RETRY_MAX_S = 1.0, 30.0
"""The first wait before a failed stage is tried again, and the longest."""


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


class WorkerFollower:
    """Follows `store` for one worker: `params()` gives its parameters (name -> tensor, read
    at each stage: an engine may replace them), in the layout `slices` (checkpoint name ->
    `Slice`); posts to `board`."""

    def __init__(self, store, params, slices, board: StageBoard, *, watch_timeout_s: float = 5.0,
                 max_pending: int = 4, verify=None, device_budget: int | None = None) -> None:
        self.store, self.params, self.slices, self.board = store, params, slices, board
        self.watch_timeout_s, self.max_pending, self.verify = watch_timeout_s, max_pending, verify
        self.device_budget = device_budget
        """Bytes of device memory the staged versions' patches may hold (`stage_entry`)."""
        self.views = HeldViews(slices)
        """This worker's slices as views of its parameters, kept between versions."""
        self.chain: list[Step] = []
        self.stages: dict[int, Staged] = {}
        """What staging each version took here (metrics)."""
        self.errors: list[str] = []
        self._failed_keys: set[str] = set()
        self._failed = False
        self._retry_at, self._backoff, self._failed_epoch = 0.0, RETRY_S, 0
        self._seen = board.state()
        self._manifest, self._etag = Manifest(), None
        self._stop, self._hold = threading.Event(), threading.Event()
        self._thread = threads.start(self._run, "weight-teleport-worker", self._stop.set)

    def hold(self, on: bool) -> None:
        """Stop staging new versions (on) or go on (off); what is staged stays staged."""
        (self._hold.set if on else self._hold.clear)()

    def close(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as e:  # never let the thread die quietly: log and go on
                _log.exception("worker follower step failed")
                self.errors.append(repr(e))
                self._stop.wait(1.0)

    def _step(self) -> None:
        self._catch_up_with_board()
        if self._failed and (time.monotonic() >= self._retry_at or self.board.epoch != self._failed_epoch):
            self._failed = False  # the group has not decided yet: try again
        if self._failed or self._hold.is_set() or len(self.chain) >= self.max_pending:
            self.board.wait_change(self._seen, 0.2)  # _catch_up_with_board reads the change
            return
        base = self.chain[-1].version if self.chain else self.board.applied
        try:
            plan = plan_avoiding(self._manifest, base, self._failed_keys, set())
        except NoPlanError:
            plan = None
        if plan is None or not plan.steps:
            self._refresh()
            return
        entry, epoch, t0 = plan.steps[0], self.board.epoch, time.perf_counter()
        try:
            step = stage_entry(self.store, entry, self.params(), self.slices, pending=self.chain,
                               device_budget=self.device_budget, views=self.views)
        except STAGE_ERRORS as e:
            _log.warning("staging version %d (%s) failed on this worker: %s", entry.version, entry.key, e)
            self.errors.append(f"{entry.key}: {e}")
            self._failed_keys.add(entry.key)
            self._failed, self._failed_epoch = True, epoch
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(2 * self._backoff, RETRY_MAX_S)
            self.board.fail(entry.version, e, epoch)
            return
        self._backoff = RETRY_S
        self._failed_keys.discard(entry.key)
        self.chain.append(step)
        self.stages[step.version] = Staged(step.fetched, step.fetch_s, time.perf_counter() - t0, step.nbytes,
                                           time.time())
        self.board.put(step.version, tuple(self.chain))

    def _catch_up_with_board(self) -> None:
        state = self.board.state()
        applied, resyncs, _ = state
        if resyncs != self._seen[1]:  # the group refused a version: stage again from what is applied
            self.chain, self._failed = [], False
        self.chain = [s for s in self.chain if applied is None or s.version > applied]
        self._seen = state

    def _refresh(self) -> None:
        try:
            raw = self.store.watch(self._etag, self.watch_timeout_s)
        except StoreError as e:
            self.errors.append(f"manifest: {e}")
            self._stop.wait(1.0)
            return
        if raw is not None:
            self._etag = manifest_etag(raw)  # a bad manifest is not read again until it changes
            self._manifest = from_json(raw, verify=self.verify)
