"""`dist://?src=RANK[&backend=nccl]`: broadcast objects to every rank of a torch.distributed job.

Every rank opens the store together (it creates a process group, a collective call:
gloo by default, NCCL with `backend=nccl`, where each rank's current CUDA device carries
the bytes) and holds a full replica in memory. Only the source rank writes: each write is applied to
its replica and broadcast; the other ranks apply broadcasts on a background thread, so
their reads and `watch` are local. The caller initialises torch.distributed first.
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import parse_qs, urlsplit

import torch
import torch.distributed as dist

from weight_teleport import threads

from .base import UNCONDITIONAL, IfMatch
from .config import StoreConfig
from .errors import StoreError
from .memory import MemoryStore

log = logging.getLogger(__name__)
_PUT, _DELETE, _MANIFEST, _CLOSE = range(4)


class DistStore(MemoryStore):
    """A replicated in-memory store fed by broadcasts from rank `src`."""

    def __init__(self, src: int = 0, config: StoreConfig | None = None, backend: str = "gloo"):
        super().__init__(None, config)
        if not dist.is_initialized():
            raise StoreError("dist:// needs torch.distributed initialised first (torch.distributed.init_process_group)")
        if backend not in ("gloo", "nccl"):
            raise StoreError(f"dist:// backend {backend!r} is not supported: use gloo or nccl")
        if backend == "nccl" and not torch.cuda.is_available():
            raise StoreError("dist://?backend=nccl needs a CUDA device on every rank")
        self.src = src
        self._device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self._group = dist.new_group(backend=backend)
        self._send_lock = threading.RLock()  # held across a compare-and-swap and its broadcast
        self._receiver: threading.Thread | None = None
        if dist.get_rank() != src:
            # at exit it is joined (weight_teleport.threads): it ends when the source
            # closes the store or its process ends
            self._receiver = threads.start(self._receive, "weight-teleport-dist", self._exiting)

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None) -> "DistStore":
        """Open `dist://?src=RANK` (source rank 0 by default)."""
        query = parse_qs(urlsplit(url).query)
        return cls(int(query.get("src", ["0"])[0]), config, query.get("backend", ["gloo"])[0])

    def _check_source(self) -> None:
        if self._group is None:
            raise StoreError("this dist:// store is closed: open a new one (on every rank) to write")
        if dist.get_rank() != self.src:
            raise StoreError(
                f"only rank {self.src} (the source) writes to this dist:// store; rank {dist.get_rank()} reads it"
            )

    def _broadcast(self, op: int, key: str = "", data: bytes = b"") -> None:
        self._check_source()
        payload = key.encode() + data
        header = torch.tensor([op, len(key.encode()), len(payload)], dtype=torch.int64, device=self._device)
        with self._send_lock:
            dist.broadcast(header, self.src, group=self._group)
            if payload:
                body = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self._device)
                dist.broadcast(body, self.src, group=self._group)

    def _exiting(self) -> None:
        log.info("the interpreter exits: waiting for rank %d to close the dist:// store (or to end)", self.src)

    def _receive(self) -> None:
        """Apply the source's broadcasts to the local replica until it closes."""
        try:
            while self._apply_next():
                pass
        except Exception:  # the source died or the group broke: keep the replica
            log.exception("dist:// store stopped receiving from rank %d", self.src)

    def _apply_next(self) -> bool:
        header = torch.empty(3, dtype=torch.int64, device=self._device)
        dist.broadcast(header, self.src, group=self._group)
        op, key_len, size = header.tolist()
        payload = b""
        if size:
            body = torch.empty(size, dtype=torch.uint8, device=self._device)
            dist.broadcast(body, self.src, group=self._group)
            payload = body.cpu().numpy().tobytes()
        key, data = payload[:key_len].decode(), payload[key_len:]
        if op == _PUT:
            super()._put(key, data)
        elif op == _DELETE:
            super()._delete(key)
        elif op == _MANIFEST:
            super()._put_manifest(data, UNCONDITIONAL)
        return op != _CLOSE

    def _put(self, key: str, data: bytes) -> None:
        super()._put(key, data)
        self._broadcast(_PUT, key, data)

    def _delete(self, key: str) -> None:
        super()._delete(key)
        self._broadcast(_DELETE, key)

    def _put_manifest(self, data: bytes, if_match: IfMatch = UNCONDITIONAL) -> None:
        """Compare and swap on the source's replica, then broadcast (only the source
        writes, so its replica is the truth); the send lock keeps replicas in order."""
        self._check_source()
        with self._send_lock:
            super()._put_manifest(data, if_match)
            self._broadcast(_MANIFEST, data=data)

    def _check_write(self) -> None:
        self._check_source()

    def close(self) -> None:
        """On the source, tell the other ranks to stop; elsewhere, wait for that. Then end
        the store's process group: its threads have ended when this returns (a gloo thread
        left running can abort the interpreter's exit; `pipeline/ranks.py` says why)."""
        if self._group is None:
            return
        try:
            if self._receiver is None:
                self._broadcast(_CLOSE)
            else:
                self._receiver.join()
        finally:
            # the store holds the group's only reference: dropping it joins its threads
            group, self._group = self._group, None
            if dist.is_initialized():  # else the job destroyed every group already
                dist.destroy_process_group(group)
