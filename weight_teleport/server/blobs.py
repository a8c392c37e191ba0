"""Content hashes of stored files and byte-range responses, for the origin's handlers."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from aiohttp import web

from ..observe.logs import kv
from ..store.hashing import PIECE_BYTES, TreeHasher
from .connections import CONNECTIONS

IMMUTABLE = "public, max-age=31536000, immutable"
SENDFILE_BYTES = 1 << 20
"""The most one sendfile call sends. Each call gets the stall limit to finish, so a client
is cut once it reads less than this in `ServerConfig.body_timeout_s`: a pause, never a
long transfer at any steady rate above that."""
log = logging.getLogger(__name__)


class HashIndex:
    """Content hashes of files, remembered until the file changes (inode, size, mtime)."""

    def __init__(self):
        self._known: dict[Path, tuple[tuple[int, int, int], str]] = {}

    @staticmethod
    def _stamp(st: os.stat_result) -> tuple[int, int, int]:
        return st.st_ino, st.st_size, st.st_mtime_ns

    def remember(self, path: Path, digest: str) -> None:
        """Record the hash of a file just written (raises FileNotFoundError if gone)."""
        self._known[path] = (self._stamp(path.stat()), digest)

    def forget(self, path: Path) -> None:
        """Drop what is known of a deleted file."""
        self._known.pop(path, None)

    async def hash_of(self, path: Path) -> str:
        """The hex SHA-256 of a file; raises FileNotFoundError if it does not exist."""
        stamp = self._stamp(path.stat())
        known = self._known.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        digest = await asyncio.get_running_loop().run_in_executor(None, self._hash, path)
        self._known[path] = (stamp, digest)
        return digest

    def _hash(self, path: Path) -> str:
        sha = TreeHasher()
        with open(path, "rb") as f:
            while chunk := f.read(PIECE_BYTES):
                sha.update(chunk)
        return sha.hexdigest()


def _byte_range(request: web.Request, size: int) -> tuple[int, int] | None:
    """The [start, stop) asked by the Range header, None for the whole object."""
    try:
        rng = request.http_range
    except ValueError:
        raise web.HTTPBadRequest(text=f"malformed Range header {request.headers.get('Range')!r}") from None
    if rng.start is None and rng.stop is None:
        return None
    start = max(0, rng.start if rng.start >= 0 else size + rng.start)  # -N: the last N
    stop = size if rng.stop is None else min(size, rng.stop)
    if start >= size or start >= stop:
        raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
    return start, stop


async def send_file(
    request: web.Request, path: Path, headers: dict[str, str], chunk_bytes: int, stall_s: float
) -> web.StreamResponse:
    """Stream `path` (or the asked byte range of it) with `headers` added."""
    f = open(path, "rb")
    try:
        size = os.fstat(f.fileno()).st_size
        span = _byte_range(request, size)
        start, stop = span or (0, size)
        resp = web.StreamResponse(status=206 if span else 200, headers=headers)
        resp.headers["Accept-Ranges"] = "bytes"
        resp.content_type = "application/octet-stream"
        resp.content_length = stop - start
        if span:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        await resp.prepare(request)
        if request.method != "HEAD":
            try:
                await _send_span(request, f, start, stop, resp, chunk_bytes, stall_s)
            except ConnectionError as exc:
                # The client left, or was cut for not reading (the guard logs that): an
                # expected end, not a handler's error. aiohttp's own end of the response
                # finds the connection closed and says nothing.
                log.debug("%s", kv("response_ended", path=request.path, error=exc))
                return resp
        await resp.write_eof()
        return resp
    finally:
        f.close()


async def _send_span(
    request: web.Request, f, start: int, stop: int, resp: web.StreamResponse, chunk: int, stall_s: float
) -> None:
    """Send bytes [start, stop) of `f` with the kernel's sendfile where the transport
    allows it (plain TCP), in pieces of `SENDFILE_BYTES`, each bounded by the stall limit
    (a client that stops reading is cut, as `connections.Guard` cuts buffered writes);
    TLS and other transports get the copying loop. Raises ConnectionError if the client
    is gone or was cut."""
    loop = asyncio.get_running_loop()
    transport = request.transport
    if transport is None or transport.get_extra_info("sslcontext") is not None:
        return await _copy(f, start, stop, resp, chunk)
    at = start
    while at < stop:
        count = min(SENDFILE_BYTES, stop - at)
        try:
            sent = await asyncio.wait_for(loop.sendfile(transport, f, at, count, fallback=False), stall_s)
        except (NotImplementedError, RuntimeError):  # no native sendfile here
            return await _copy(f, at, stop, resp, chunk)
        except asyncio.TimeoutError:
            guard = request.app[CONNECTIONS].guard_of(transport)
            if guard is not None:
                guard.cut("stalled_write")
            else:
                transport.abort()
            raise ConnectionAbortedError(f"a client stopped reading {f.name}") from None
        if sent == 0:
            raise ConnectionAbortedError(f"{f.name} shrank while being served")
        at += sent


async def _copy(f, start: int, stop: int, resp: web.StreamResponse, chunk: int) -> None:
    loop = asyncio.get_running_loop()
    f.seek(start)
    left = stop - start
    while left > 0:
        data = await loop.run_in_executor(None, f.read, min(chunk, left))
        if not data:
            raise ConnectionAbortedError(f"{f.name} shrank while being served")
        await resp.write(data)
        left -= len(data)
