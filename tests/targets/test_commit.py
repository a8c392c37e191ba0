"""The cross-rank commit over a real gloo process group of two ranks: a version is applied
on both ranks or on none; one rank failing makes both resync; a lagging rank makes both
skip (and a later commit of the same version, once staged, applies it); a failure posted
before a vote is tried again for it, so a repaired store's version is applied at once."""

import os
import socket
import threading
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from weight_teleport.errors import DigestMismatchError
from weight_teleport.targets.commit import Outcome, StageBoard, commit


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    board, applied, log = StageBoard(), [], []

    def step(version, *, wait_s=0.2):
        log.append((version, commit(version, board, applied.append, wait_s=wait_s).name, list(applied)))

    board.put(1, "v1")
    step(1)  # both ready: applied on both
    board.put(2, "v2") if rank == 0 else board.fail(2, DigestMismatchError("corrupt chunk"))
    step(2)  # rank 1's copy is corrupt: nobody applies
    log.append(board.resyncs)
    if rank == 0:
        board.put(3, "v3")
    step(3)  # rank 1 lags: both skip
    if rank == 1:  # rank 1 catches up while rank 0 waits
        threading.Thread(target=lambda: (time.sleep(0.2), board.put(3, "v3"))).start()
    step(3, wait_s=120)
    board.put(4, "v4") if rank == 0 else board.fail(4, DigestMismatchError("corrupt chunk"))
    if rank == 1:  # the store is repaired: the vote's retry stages it
        threading.Thread(target=_retry_when_asked, args=(board, 4, board.epoch)).start()
    step(4, wait_s=120)
    results.put((rank, log))
    dist.destroy_process_group()


def _retry_when_asked(board: StageBoard, version: int, epoch: int) -> None:
    """A follower's retry: once a vote begins an epoch after `epoch`, stage `version`."""
    seen = board.state()
    while seen[2] <= epoch:
        seen = board.wait_change(seen, 60)
    board.put(version, f"v{version}")


def test_commit_is_all_or_nothing_across_ranks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    logs = dict(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = [
        (1, "APPLIED", ["v1"]),
        (2, "RESYNC", ["v1"]),
        1,
        (3, "SKIPPED", ["v1"]),
        (3, "APPLIED", ["v1", "v3"]),
        (4, "APPLIED", ["v1", "v3", "v4"]),
    ]
    assert logs[0] == logs[1] == expected
    assert Outcome.RESYNC > Outcome.SKIPPED > Outcome.APPLIED  # the vote takes the worst


def test_group_outcome_needs_every_rank_on_the_version():
    from weight_teleport.targets.worker_local import group_outcome

    def ranks(*latest):
        return [{"outcomes": [] if o is None else [[1, "APPLIED"], list(o)]} for o in latest]

    assert group_outcome(ranks((2, "SKIPPED"), (2, "SKIPPED")), 2) == "SKIPPED"
    assert group_outcome(ranks((2, "APPLIED"), (2, "SKIPPED")), 2) is None  # ranks disagree
    assert group_outcome(ranks((2, "APPLIED"), (2, "APPLIED")), 3) is None  # not this version's
    assert group_outcome(ranks((2, "APPLIED"), None), 2) is None  # a rank never committed
