"""The collectives of a `PublisherGroup`'s ranks: object collectives (metadata only) on a
gloo process group that the publisher alone holds and `close` ends.

Contract: once `close` returns, the group's gloo threads have ended, so none is left to
run while the interpreter finalizes. The reason: a gloo worker thread
(`ProcessGroupGloo::runLoop`) drops its reference to a collective's Work after the
caller's `wait()` has returned; when that reference is the last, freeing the Work's
tensors releases their Python objects and takes the GIL. CPython before 3.14 ends a thread
that takes the GIL after finalization has begun with `pthread_exit`, which unwinds into
that noexcept C++ frame: the process aborts ("terminate called without an active
exception", status 134). `destroy_process_group()` ends a group's threads only when it
drops the last reference to the group, and anything may hold a group the job shares
(FSDP2's `DeviceMesh` keeps the default group to the end of the process). Beside torch's
own maps, which `destroy_process_group()` clears, this group's only reference is
`Ranks._group`: `close` destroys the group and drops it, and its destructor (which
releases the GIL) joins the threads.

A failed collective is raised as `GroupFailed` carrying the message only: the original
exception's traceback holds torch's frames, whose locals hold the group, so an exception
kept by a caller, or passing out of a `with` block while `close` runs, would keep the
group and its threads alive."""

from __future__ import annotations

import torch.distributed as dist

from weight_teleport.pipeline.errors import GroupFailed


class Ranks:
    """A gloo group of `group`'s ranks (default: every rank of the job). A collective call:
    every rank of `group` makes one, together."""

    def __init__(self, group=None):
        if group is None:
            self._group = dist.new_group(backend="gloo")
        else:  # the other ranks of the job do not take part
            self._group = dist.new_group(
                dist.get_process_group_ranks(group), backend="gloo", use_local_synchronization=True
            )
        self.rank = dist.get_rank(self._group)
        self.size = dist.get_world_size(self._group)

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        out = [None] * self.size
        self._run(dist.all_gather_object, out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        box = [obj]
        self._run(dist.broadcast_object_list, box, dist.get_global_rank(self._group, 0))
        return box[0]

    def _run(self, collective, *args) -> None:
        try:
            collective(*args, group=self._group)
        except Exception as exc:  # raised below, outside this block: no traceback kept
            failure = f"{type(exc).__name__}: {exc}"
        else:
            return
        raise GroupFailed(
            f"rank {self.rank}: a collective of the group failed (a rank died, left or timed out): {failure}"
        )

    def close(self) -> None:
        """End the group; its threads have ended when this returns (module docstring)."""
        group, self._group = self._group, None
        if group is not None and dist.is_initialized():  # else the job destroyed every group
            dist.destroy_process_group(group)
