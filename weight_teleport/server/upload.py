"""An upload's body, from the socket to a pending file, off the event loop.

The loop only copies each arriving chunk into a piece buffer (one `memcpy`); every full
piece of the tree hash (`store.hashing.PIECE_BYTES`) is hashed and written at its offset by
a worker thread, which also starts the kernel's writeback of that piece so that the
`fsync` at commit finds little left to write. At most `depth` pieces are in flight; a body
that arrives faster than the threads keep up waits for the oldest (backpressure on the
socket, memory bounded by `depth` pieces).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from collections import deque
from concurrent.futures import Future

from ..store.file import AtomicFile
from ..store.hashing import PIECE_BYTES, hash_pool, hash_threads, piece_digest, root_of

_SYNC_FILE_RANGE_WRITE = 2


def _writeback_starter():
    """Linux's `sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)`, or None elsewhere:
    it queues the range for writeback and returns without waiting."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_start_writeback = _writeback_starter()


def _store_piece(fd: int, piece: memoryview, offset: int) -> bytes:
    """Write `piece` at `offset` of `fd`, start its writeback, return its digest."""
    digest = piece_digest(piece)
    done = 0
    while done < len(piece):
        done += os.pwrite(fd, piece[done:], offset + done)
    if _start_writeback is not None:
        _start_writeback(fd, offset, len(piece), _SYNC_FILE_RANGE_WRITE)
    return digest


class PieceSink:
    """Bytes fed in order become `out`'s content, hashed as `store.hashing`'s tree."""

    def __init__(
        self, out: AtomicFile, *, expected: int | None = None, piece_bytes: int = PIECE_BYTES, depth: int | None = None
    ):
        """`expected`: the body's length where known (a small body gets a small buffer)."""
        self._fd, self._expected = out.fileno(), expected
        self._piece_bytes = piece_bytes
        self._depth = depth or max(2, min(8, hash_threads()))
        self._free: list[bytearray] = []
        self._pending: deque[tuple[Future, bytearray]] = deque()
        self._digests: list[bytes] = []
        self._buf: bytearray | None = None  # the piece being filled, and a view of it
        self._view: memoryview | None = None
        self._fill = 0

    async def feed(self, data: bytes) -> None:
        """Append `data`; waits while `depth` pieces are being hashed and written."""
        rest = memoryview(data)
        while len(rest):
            if self._buf is None:
                await self._new_piece()
            assert self._buf is not None and self._view is not None
            if self._fill == len(self._buf):  # a body longer than it announced
                self._view.release()
                self._buf.extend(bytes(self._piece_bytes - len(self._buf)))
                self._view = memoryview(self._buf)
            take = min(len(rest), len(self._buf) - self._fill)
            self._view[self._fill : self._fill + take] = rest[:take]
            self._fill += take
            rest = rest[take:]
            if self._fill == self._piece_bytes:
                self._submit()

    async def finish(self) -> str:
        """Write what is left; return the tree hash of everything fed."""
        if self._buf is not None and self._fill:
            self._submit()
        while self._pending:
            await self._retire()
        return root_of(self._digests)

    async def drain(self) -> None:
        """Wait for the pieces in flight, ignoring their errors: the file they write may be
        closed (and its descriptor reused) only after them."""
        while self._pending:
            future, _ = self._pending.popleft()
            await asyncio.wait([asyncio.wrap_future(future)])

    async def _new_piece(self) -> None:
        if not self._free and len(self._pending) >= self._depth:
            await self._retire()
        if self._free:
            self._buf = self._free.pop()
        else:
            left = (
                self._piece_bytes if self._expected is None else self._expected - self._submitted() * self._piece_bytes
            )
            self._buf = bytearray(max(1, min(self._piece_bytes, left)))
        self._view, self._fill = memoryview(self._buf), 0

    def _submit(self) -> None:
        assert self._buf is not None and self._view is not None  # a piece is being filled
        offset = self._submitted() * self._piece_bytes
        piece = self._view[: self._fill]
        future = hash_pool().submit(_store_piece, self._fd, piece, offset)
        self._pending.append((future, self._buf))
        self._buf = self._view = None

    def _submitted(self) -> int:
        return len(self._digests) + len(self._pending)

    async def _retire(self) -> None:
        """Wait for the oldest piece in flight; its digest is next in order."""
        future, buf = self._pending.popleft()
        self._digests.append(await asyncio.wrap_future(future))
        self._free.append(buf)
