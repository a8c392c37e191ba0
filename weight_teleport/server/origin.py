"""State shared by the origin's handlers, and the checks every request goes through."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from ..store.errors import InvalidKey
from ..store.file import AtomicFile, FileStore
from ..store.keys import validate_key
from .blobs import HashIndex
from .config import ServerConfig
from .tokens import bearer, matches
from .upload import PieceSink
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


def _bearer(request: web.Request, what: str) -> str:
    """The request's bearer token; 401 without one, 400 if it is not ASCII."""
    given = bearer(request)
    if given is None:
        raise web.HTTPUnauthorized(
            text=f"{what} need 'Authorization: Bearer TOKEN'", headers={"WWW-Authenticate": "Bearer"}
        )
    if not given.isascii():
        raise web.HTTPBadRequest(
            text="the Authorization header is not ASCII: a bearer token is made of ASCII characters (RFC 6750)"
        )
    return given


def require_token(request: web.Request, token: str | None) -> None:
    """401 without a bearer token, 403 with a wrong one (or when uploads are off)."""
    if token is None:
        raise web.HTTPForbidden(text="uploads are disabled: start the server with a token")
    if not matches(_bearer(request, "uploads"), token):
        raise web.HTTPForbidden(text="wrong upload token")


def require_reader(request: web.Request, config: ServerConfig) -> None:
    """Where the origin has a read token, reads need it (or the upload token)."""
    if config.read_token is None:
        return
    given = _bearer(request, "reads")
    if not (matches(given, config.read_token) or matches(given, config.token)):
        raise web.HTTPForbidden(text="wrong read token")


def _too_large(limit: int) -> web.HTTPRequestEntityTooLarge:
    # the body's size is unknown (it is cut at the limit); `text` replaces the message that names it
    return web.HTTPRequestEntityTooLarge(
        max_size=limit,
        actual_size=None,  # type: ignore[arg-type]
        text=f"body larger than the limit of {limit} bytes (see ServerConfig)",
    )


async def open_upload(request: web.Request, target, **kwargs) -> AtomicFile:
    """A pending file for an upload to `target` (409 where a key is a directory)."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(None, lambda: AtomicFile(target, **kwargs))
    except (FileExistsError, NotADirectoryError):
        raise web.HTTPConflict(
            text=f"{request.path} collides with another key used as a directory (as 'a' and 'a/b' do)"
        ) from None


async def receive(request: web.Request, out: AtomicFile, limit: int, *, stall_s: float) -> str:
    """Stream the body into `out` (not committed) and return its content hash (the SHA-256
    tree of `store.hashing`; pieces are hashed and written on threads, `upload.PieceSink`).

    Oversized bodies get 413, a body that does not match its X-Content-Tree-SHA256 header
    400, a body with no byte for `stall_s` seconds 408.
    """
    if (request.content_length or 0) > limit:
        raise _too_large(limit)
    sink, size = PieceSink(out, expected=request.content_length), 0
    try:
        while True:
            try:
                data = await asyncio.wait_for(request.content.readany(), stall_s)
            except asyncio.TimeoutError:
                raise web.HTTPRequestTimeout(
                    text=f"the body stalled: no byte for {stall_s:g} s (ServerConfig.body_timeout_s); upload again"
                ) from None
            if not data:
                break
            size += len(data)
            if size > limit:
                raise _too_large(limit)
            await sink.feed(data)
        digest = await sink.finish()
    finally:
        await sink.drain()
    expected = request.headers.get("X-Content-Tree-SHA256", digest).lower()
    if expected != digest:
        raise web.HTTPBadRequest(
            text=f"body hash {digest} differs from X-Content-Tree-SHA256 {expected}: corrupted upload"
        )
    return digest


def make_origin(config: ServerConfig) -> Origin:
    """The shared state of an origin serving `config.root` (created if missing)."""
    config.root.mkdir(parents=True, exist_ok=True)
    store = FileStore(config.root)
    return Origin(config, store, HashIndex(), ManifestWatch(store.manifest_path, config.disk_check_s))
