"""The content hash of stored objects: a SHA-256 tree over fixed-size pieces.

A plain SHA-256 is one sequential pass on one core: for a multi-GB pack it would cost more
than storing or fetching the bytes. The tree hash is the SHA-256 of the
concatenated SHA-256 digests of the object's consecutive `PIECE_BYTES`-byte pieces (the
last one shorter; an empty object has no pieces). Its pieces are hashed on all cores at
once, and a reader that fetches an object in piece-aligned ranges hashes each range as
it arrives. It is as collision-resistant as SHA-256 itself: a collision of the root is a
collision of SHA-256 or of one piece.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

PIECE_BYTES = 8 << 20
"""Bytes per hashed piece (the manifest records it with each entry)."""
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def hash_threads() -> int:
    """Threads that hash pieces at once: every core, at most 16 (hashlib releases the GIL
    for large buffers, so the pieces run in parallel)."""
    return max(1, min(16, os.cpu_count() or 1))


def hash_pool() -> ThreadPoolExecutor:
    """The threads that hash pieces (`hash_threads()` of them, started on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(hash_threads(), thread_name_prefix="wt-hash")
        return _pool


def piece_digest(piece) -> bytes:
    """The SHA-256 digest of one piece (any bytes-like object)."""
    return hashlib.sha256(piece).digest()


def root_of(digests: list[bytes]) -> str:
    """The tree hash (hex) whose pieces have `digests`, in order."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


def tree_sha256(data, piece_bytes: int = PIECE_BYTES) -> str:
    """The hex tree hash of `data` (any bytes-like object), its pieces hashed in parallel."""
    view = memoryview(data).cast("B")
    starts = range(0, len(view), piece_bytes)
    if len(starts) <= 1:
        return root_of([piece_digest(view[s : s + piece_bytes]) for s in starts])
    pool = hash_pool()
    futures = [pool.submit(piece_digest, view[s : s + piece_bytes]) for s in starts]
    return root_of([f.result() for f in futures])


def object_hash(data, piece_bytes: int) -> str:
    """The hex content hash of `data` as a manifest entry with `piece_bytes` names it:
    the tree hash, or the plain SHA-256 where `piece_bytes` is 0 (older manifests)."""
    if piece_bytes == 0:
        return hashlib.sha256(data).hexdigest()
    return tree_sha256(data, piece_bytes)


class TreeHasher:
    """The tree hash of a stream of bytes given in any cuts: full pieces are hashed on the
    pool while more bytes arrive; `hexdigest()` waits for them."""

    def __init__(self, piece_bytes: int = PIECE_BYTES):
        self.piece_bytes = piece_bytes
        self._partial = bytearray()
        self._futures: list[Future] = []
        self.size = 0

    def update(self, data) -> None:
        data = memoryview(data).cast("B")
        self.size += len(data)
        while len(data):
            take = min(len(data), self.piece_bytes - len(self._partial))
            self._partial += data[:take]
            data = data[take:]
            if len(self._partial) == self.piece_bytes:
                self._futures.append(hash_pool().submit(piece_digest, bytes(self._partial)))
                self._partial = bytearray()

    def hexdigest(self) -> str:
        digests = [f.result() for f in self._futures]
        if self._partial:
            digests.append(piece_digest(self._partial))
        return root_of(digests)
