"""State shared by the origin's handlers, and the checks every upload goes through."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ..store.errors import InvalidKey
from ..store.file import AtomicFile, FileStore
from ..store.keys import validate_key
from .blobs import HashIndex
from .config import ServerConfig
from .watch import ManifestWatch


@dataclass
class Origin:
    """What the handlers share: the config, the directory, hashes, manifest, counters."""

    config: ServerConfig
    store: FileStore
    hashes: HashIndex
    manifest: ManifestWatch
    stats: Counter = field(default_factory=Counter)
    """Requests served, by kind ("blob_get", "blob_bytes", "upload", "watch", ...)."""


ORIGIN = web.AppKey("origin", Origin)


def request_key(request: web.Request) -> str:
    """The validated object key of the request's URL; 400 if it is not a valid key."""
    try:
        return validate_key(request.match_info["key"])
    except InvalidKey as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


def require_token(request: web.Request, token: str | None) -> None:
    """401 without a bearer token, 403 with a wrong one (or when uploads are off)."""
    if token is None:
        raise web.HTTPForbidden(text="uploads are disabled: start the server with a token")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise web.HTTPUnauthorized(text="uploads need 'Authorization: Bearer TOKEN'",
                                   headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise web.HTTPForbidden(text="wrong upload token")


def _too_large(limit: int) -> web.HTTPRequestEntityTooLarge:
    return web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=None,
                                         text=f"body larger than the limit of {limit} "
                                              f"bytes (see ServerConfig)")


async def receive(request: web.Request, path: Path, limit: int, *, overwrite: bool,
                  chunk: int) -> tuple[str, bool]:
    """Stream the body into `path` atomically; return (sha256, created).

    `created` is False when `overwrite` is False and `path` already existed. Oversized
    bodies get 413, a body that does not match its X-Content-SHA256 header 400; on any
    failure, a client disconnect included, nothing is left on disk.
    """
    if (request.content_length or 0) > limit:
        raise _too_large(limit)
    loop = asyncio.get_running_loop()
    try:
        out = await loop.run_in_executor(None, lambda: AtomicFile(path, overwrite=overwrite))
    except (FileExistsError, NotADirectoryError):
        raise web.HTTPConflict(text=f"{request.path} collides with another key used as "
                                    f"a directory (as 'a' and 'a/b' do)") from None
    sha, size = hashlib.sha256(), 0
    try:
        async for data in request.content.iter_chunked(chunk):
            size += len(data)
            if size > limit:
                raise _too_large(limit)
            sha.update(data)
            out.write(data)
        digest = sha.hexdigest()
        expected = request.headers.get("X-Content-SHA256", digest).lower()
        if expected != digest:
            raise web.HTTPBadRequest(text=f"body hash {digest} differs from "
                                          f"X-Content-SHA256 {expected}: corrupted upload")
        await loop.run_in_executor(None, out.commit)
        return digest, True
    except FileExistsError:
        return digest, False
    finally:
        out.abort()


def make_origin(config: ServerConfig) -> Origin:
    """The shared state of an origin serving `config.root` (created if missing)."""
    config.root.mkdir(parents=True, exist_ok=True)
    store = FileStore(config.root)
    return Origin(config, store, HashIndex(config.chunk_bytes),
                  ManifestWatch(store.manifest_path, config.disk_check_s))
