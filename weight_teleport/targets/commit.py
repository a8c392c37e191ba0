"""The cross-rank commit of a version staged by every tensor-parallel worker on its own.

Each worker's follower stages versions into its `StageBoard` while the engine generates
(staged and verified, or failed). The pause is one tiny call on every rank, `commit(V)`:

1. **Vote.** Each rank waits (at most `wait_s`) for its own stage of V, then the group
   takes the worst of the ranks' states with one all-reduce of one integer over the TP
   group's CPU process group: READY (staged and verified), LAGGING (not staged in time),
   FAILED (staging or verification failed).
2. **Decide alike.** Every rank sees the same reduced state, so all take the same branch:
   all READY: every rank applies V; any FAILED: no rank applies V and the group resyncs
   (every rank's follower restages from the next snapshot); else (a rank lags): no rank
   applies V, and V stays staged where it was, for a later `commit(V)` or a newer version.

A failure answers a vote only if its attempt began after the vote's wait began: a store can
be repaired, so an older failure makes the rank's follower try again at once, and the vote
waits (at most `wait_s`) for that attempt; at the deadline the older failure stands.

A rank applies only what it staged and verified before the vote, and staging checks every
index and shape, so after a unanimous vote applying is plain writes: the engine never
serves a mix of versions."""

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist


class Outcome(enum.IntEnum):
    """What the group did with a version (equal on every rank). The values are the vote's
    states: the group's outcome is the worst (largest) of its ranks' states."""

    APPLIED = 0
    SKIPPED = 1
    RESYNC = 2


@dataclass(frozen=True)
class _Entry:
    patch: Any = None
    error: BaseException | None = None
    epoch: int = 0
    """The board's epoch when the attempt began (see `StageBoard.epoch`)."""


class StageBoard:
    """One worker's staged versions: written by its follower thread, read by `commit`."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._cond = threading.Condition()
        self.applied: int | None = None
        """The version this rank applied last (set by `commit`)."""
        self.resyncs = 0
        """How many times the group refused a version for a failed rank: each one tells this
        rank's follower to drop what it staged and stage again."""
        self.epoch = 0
        """Counts the votes' waits: a failed stage whose attempt began in an earlier epoch is
        tried again by the follower, and only an attempt of the current epoch answers."""

    def state(self) -> tuple[int | None, int, int]:
        """(applied version, resyncs, epoch): what the follower waits on."""
        return self.applied, self.resyncs, self.epoch

    def put(self, version: int, patch: Any) -> None:
        """Version `version` is staged and verified on this rank."""
        with self._cond:
            self._entries[version] = _Entry(patch=patch)
            self._cond.notify_all()

    def fail(self, version: int, error: BaseException, epoch: int | None = None) -> None:
        """Staging or verifying `version` failed on this rank, in an attempt begun in `epoch`
        (default: the current one)."""
        with self._cond:
            self._entries[version] = _Entry(error=error, epoch=self.epoch if epoch is None else epoch)
            self._cond.notify_all()

    def withdraw(self) -> None:
        """Drop every version posted and not yet decided: this rank's follower resynced,
        so they were staged on weights it no longer trusts as a base."""
        with self._cond:
            self._entries.clear()
            self._cond.notify_all()

    def _entry(self, version: int) -> _Entry | None:
        """The entry for `version`, or else a failed one of an earlier version: this rank
        cannot reach `version` without a resync or a successful retry of that one."""
        if version in self._entries:
            return self._entries[version]
        return next((e for v, e in sorted(self._entries.items()) if v < version and e.error is not None), None)

    def wait(self, version: int, timeout_s: float) -> _Entry | None:
        """This rank's entry for `version`, waiting at most `timeout_s`; None if still absent.
        Begins a new epoch: a failure from an earlier one is tried again (the follower wakes
        on it) and answers only if no later attempt has answered by the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.epoch += 1
            epoch = self.epoch
            self._cond.notify_all()
            while True:
                entry = self._entry(version)
                if entry is not None and (entry.error is None or entry.epoch >= epoch):
                    return entry
                left = deadline - time.monotonic()
                if left <= 0:
                    return entry
                self._cond.wait(left)

    def wait_change(self, seen: tuple[int | None, int, int], timeout_s: float) -> tuple[int | None, int, int]:
        """Wait at most `timeout_s` until `state()` differs from `seen`; returns it (the
        follower's wake-up after a commit or at a vote's new epoch)."""
        with self._cond:
            self._cond.wait_for(lambda: self.state() != seen, timeout_s)
            return self.state()

    def _decided(self, version: int, outcome: Outcome) -> None:
        with self._cond:
            if outcome is Outcome.APPLIED:
                self.applied = version
            if outcome is not Outcome.SKIPPED:
                for v in [v for v in self._entries if v <= version or outcome is Outcome.RESYNC]:
                    del self._entries[v]
            if outcome is Outcome.RESYNC:
                self.resyncs += 1
            self._cond.notify_all()


def _vote(state: Outcome, group) -> Outcome:
    flag = torch.tensor([int(state)], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return Outcome(int(flag.item()))


def commit(
    version: int, board: StageBoard, apply: Callable[[Any], None], *, group=None, wait_s: float = 30.0
) -> Outcome:
    """Apply `version` on every rank of `group` or on none (see the module docstring).
    Call on every rank of the group at once; returns the group's outcome."""
    if board.applied is not None and version <= board.applied:
        raise ValueError(f"version {version} is not newer than the applied version {board.applied}")
    entry = board.wait(version, wait_s)
    mine = Outcome.SKIPPED if entry is None else Outcome.RESYNC if entry.error is not None else Outcome.APPLIED
    outcome = _vote(mine, group)
    if outcome is Outcome.APPLIED:
        assert entry is not None  # the group's outcome is its worst vote: this rank's was APPLIED
        apply(entry.patch)
    board._decided(version, outcome)
    return outcome
