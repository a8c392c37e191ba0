"""The origin's routes: content-addressed objects, the manifest, long-poll, listing.

    GET    /o/KEY              307 to /b/HASH/KEY (no-cache), X-Content-Tree-SHA256: HASH
    PUT    /o/KEY              upload (bearer token); 201, or 200 if identical, 409 if not
    DELETE /o/KEY              delete (bearer token); 204
    GET    /b/HASH/KEY         the bytes, Range supported, cacheable forever
    GET    /manifest           the manifest (no-cache, ETag); PUT replaces it (token)
    GET    /watch?after=ETAG&timeout=S   200 + manifest when it changes, else 304 (204
                               if there is no manifest) at timeout
    GET    /list?prefix=P      {"keys": [...]}
    GET    /auth/upload        204 if the bearer token may upload (a writer's probe)
    GET    /healthz            readiness probe (never needs a token)
    GET    /metrics            Prometheus metrics (text exposition format)
    PUT    /samplers/ID        a sampler's heartbeat (samplers.py; the read token)
    GET    /status.json        versions, samplers, chart series (status.py)
    GET    / and /status       the status page (status_page.py)

`PUT /manifest` is conditional with `If-Match: "ETAG"` (the manifest the writer read) or
`If-None-Match: *` (no manifest yet): 412 if the manifest is another one. With a read
token configured, every GET needs `Authorization: Bearer` with it (or the upload token).
"""

from __future__ import annotations

import asyncio
import errno
import re

from aiohttp import web

from ..store.base import UNCONDITIONAL, IfMatch
from ..store.errors import InvalidKey, ManifestChanged
from ..store.file import MISSING, NO_SPACE, AtomicFile
from ..store.keys import validate_prefix
from .blobs import IMMUTABLE, send_file
from .config import ServerConfig
from .metrics import METRICS, OriginMetrics, count_requests, get_metrics
from .samplers import BOOK, make_book, put_sampler
from .status import get_status_json, get_status_page
from .connections import CONNECTIONS, ConnectionLimits, Handler, poll_over, track_connections
from .origin import ORIGIN, make_origin, open_upload, receive, request_key, require_reader, require_token

_HASH = re.compile(r"[0-9a-f]{64}\Z")
NO_CACHE = {"Cache-Control": "no-cache"}


async def resolve(request: web.Request) -> web.Response:
    """307 from an object's key to its content-addressed URL."""
    origin, key = request.app[ORIGIN], request_key(request)
    try:
        digest = await origin.hashes.hash_of(origin.store.path_of(key))
    except MISSING:
        raise web.HTTPNotFound(text=f"no object {key!r}") from None
    # Relative, so that it stays right behind a proxy that mounts the origin on a path.
    location = "../" * key.count("/") + f"../b/{digest}/{key}"
    return web.Response(status=307, headers={"Location": location, "X-Content-Tree-SHA256": digest, **NO_CACHE})


async def get_blob(request: web.Request) -> web.StreamResponse:
    """The immutable bytes of an object at its content address; Range gives 206."""
    origin, key, digest = request.app[ORIGIN], request_key(request), request.match_info["hash"]
    if not _HASH.match(digest):
        raise web.HTTPBadRequest(text="the content hash must be 64 lowercase hex digits")
    path = origin.store.path_of(key)
    try:
        actual = await origin.hashes.hash_of(path)
    except MISSING:
        actual = None
    if actual != digest:
        raise web.HTTPNotFound(text=f"no object {key!r} with hash {digest}")
    headers = {"ETag": f'"{digest}"', "Cache-Control": IMMUTABLE}
    if request.if_none_match and any(e.value == digest for e in request.if_none_match):
        return web.Response(status=304, headers=headers)
    resp = await send_file(request, path, headers, origin.config.chunk_bytes, origin.config.body_timeout_s)
    origin.stats["blob_get"] += 1
    origin.stats["blob_bytes"] += resp.content_length or 0
    return resp


async def put_object(request: web.Request) -> web.Response:
    """Upload an object; it is visible only once complete."""
    origin = request.app[ORIGIN]
    config = origin.config
    require_token(request, config.token)
    key = request_key(request)
    path = origin.store.path_of(key)
    out = await open_upload(request, path, overwrite=False)
    try:
        digest = await receive(request, out, config.max_object_bytes, stall_s=config.body_timeout_s)
        created = await asyncio.get_running_loop().run_in_executor(None, _link, out)
    finally:
        out.abort()
    if not created and (not path.is_file() or await origin.hashes.hash_of(path) != digest):
        raise web.HTTPConflict(
            text=f"object {key!r} exists with other bytes; objects are immutable: upload under a new key"
        )
    origin.hashes.remember(path, digest)
    origin.stats["upload"] += 1
    return web.Response(
        status=201 if created else 200, headers={"X-Content-Tree-SHA256": digest, "ETag": f'"{digest}"'}
    )


def _link(out: AtomicFile) -> bool:
    """Commit a new object; False if one exists under its key already."""
    try:
        out.commit()
        return True
    except FileExistsError:
        return False


async def delete_object(request: web.Request) -> web.Response:
    """Delete an object (retention); its cached copies expire with their URLs' use."""
    origin = request.app[ORIGIN]
    require_token(request, origin.config.token)
    path = origin.store.path_of(request_key(request))
    try:  # unlinking a multi-GB file takes long enough to stall every other request
        await asyncio.get_running_loop().run_in_executor(None, path.unlink)
    except MISSING:
        raise web.HTTPNotFound(text=f"no object {request.match_info['key']!r}") from None
    origin.hashes.forget(path)
    return web.Response(status=204)


async def get_manifest(request: web.Request) -> web.Response:
    """The manifest, revalidated by caches on every use."""
    manifest = request.app[ORIGIN].manifest.current()
    if manifest is None:
        raise web.HTTPNotFound(text="no manifest yet", headers=NO_CACHE)
    data, etag = manifest
    headers = {"ETag": f'"{etag}"', **NO_CACHE}
    if request.if_none_match and any(e.value == etag for e in request.if_none_match):
        return web.Response(status=304, headers=headers)
    return web.Response(body=data, headers=headers, content_type="application/octet-stream")


async def put_manifest(request: web.Request) -> web.Response:
    """Replace the manifest atomically (if it is the one the writer names) and wake the
    long-polls."""
    origin = request.app[ORIGIN]
    config = origin.config
    require_token(request, config.token)
    if_match = _manifest_condition(request)
    out = await open_upload(request, origin.store.manifest_path, overwrite=True)
    try:
        digest = await receive(request, out, config.max_manifest_bytes, stall_s=config.body_timeout_s)
        await asyncio.get_running_loop().run_in_executor(None, origin.store.commit_manifest, out, if_match)
    except ManifestChanged as exc:
        raise web.HTTPPreconditionFailed(text=str(exc), headers=NO_CACHE) from None
    finally:
        out.abort()
    origin.manifest.notify()
    return web.Response(status=204, headers={"ETag": f'"{digest}"'})


def _manifest_condition(request: web.Request) -> IfMatch:
    """The ETag `If-Match` names, None for `If-None-Match: *`, else UNCONDITIONAL."""
    raw_match, raw_none = request.headers.get("If-Match"), request.headers.get("If-None-Match")
    if raw_match is not None and raw_none is not None:
        raise web.HTTPBadRequest(text="send If-Match or If-None-Match, not both")
    if raw_none is not None:
        if raw_none.strip() != "*":
            raise web.HTTPBadRequest(text="a manifest write takes If-None-Match: * only")
        return None
    if raw_match is None:
        return UNCONDITIONAL
    etags = request.if_match or ()
    if len(etags) != 1 or etags[0].value == "*" or etags[0].is_weak:
        raise web.HTTPBadRequest(
            text='a manifest write takes one If-Match: "ETAG" (the ETag of the manifest the writer read)'
        )
    return etags[0].value


async def watch(request: web.Request) -> web.Response:
    """Long-poll: answer as soon as the manifest's ETag differs from `after`."""
    origin = request.app[ORIGIN]
    after = request.query.get("after", "").strip('"')
    try:
        timeout = float(request.query.get("timeout", origin.config.max_watch_s))
    except ValueError:
        raise web.HTTPBadRequest(text="timeout must be a number of seconds") from None
    if not 0 <= timeout < float("inf"):
        raise web.HTTPBadRequest(text="timeout must be a non-negative number of seconds")
    origin.stats["watch"] += 1
    over = poll_over(request)
    with request.app[METRICS].watchers.track_inprogress():
        manifest = await origin.manifest.wait_change(after, min(timeout, origin.config.max_watch_s), over)
    headers = {"Cache-Control": "no-store"}
    if manifest is None:
        resp = web.Response(status=304 if origin.manifest.current() else 204, headers=headers)
    else:
        data, etag = manifest
        resp = web.Response(
            body=data, headers={"ETag": f'"{etag}"', **headers}, content_type="application/octet-stream"
        )
    if over is not None and over.is_set():  # ended early: its slot was wanted, or none was free
        resp.headers["Retry-After"] = "1"
        resp.force_close()
    return resp


async def list_keys(request: web.Request) -> web.Response:
    """The sorted keys that start with `prefix`."""
    origin, prefix = request.app[ORIGIN], request.query.get("prefix", "")
    try:
        validate_prefix(prefix)
    except InvalidKey as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    keys = await asyncio.get_running_loop().run_in_executor(None, origin.store.list, prefix)
    return web.json_response({"keys": keys}, headers=NO_CACHE)


async def healthz(request: web.Request) -> web.Response:
    """Readiness probe."""
    return web.Response(text="ok", headers={"Cache-Control": "no-store"})


async def check_upload(request: web.Request) -> web.Response:
    """204 if the request's bearer token may upload: a publisher's probe at start-up."""
    require_token(request, request.app[ORIGIN].config.token)
    return web.Response(status=204, headers={"Cache-Control": "no-store"})


_OPEN_PATHS = ("/healthz", "/auth/upload")  # no read token asked (the probe checks its own)


@web.middleware
async def check_reader(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Reads need the read token where one is configured."""
    if request.method in ("GET", "HEAD") and request.path not in _OPEN_PATHS:
        require_reader(request, request.app[ORIGIN].config)
    return await handler(request)


@web.middleware
async def disk_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A full disk or quota is 507 with a message, not a 500."""
    try:
        return await handler(request)
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        root = request.app[ORIGIN].config.root
        raise web.HTTPInsufficientStorage(
            text=f"the origin's disk is full ({errno.errorcode[exc.errno]} under {root}): "
            f"nothing was stored; free space there, then upload again"
        ) from None


def make_app(config: ServerConfig) -> web.Application:
    """The origin as an aiohttp application serving `config.root`."""
    app = web.Application(
        client_max_size=config.max_manifest_bytes,
        middlewares=[count_requests, track_connections, check_reader, disk_errors],
    )
    app[ORIGIN] = make_origin(config)
    app[METRICS] = OriginMetrics()
    app[BOOK] = make_book(config)
    app[CONNECTIONS] = ConnectionLimits(config)
    app.router.add_get("/o/{key:.+}", resolve)
    app.router.add_put("/o/{key:.+}", put_object)
    app.router.add_delete("/o/{key:.+}", delete_object)
    app.router.add_get("/b/{hash}/{key:.+}", get_blob)
    app.router.add_get("/manifest", get_manifest)
    app.router.add_put("/manifest", put_manifest)
    app.router.add_get("/watch", watch)
    app.router.add_get("/list", list_keys)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/auth/upload", check_upload)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_put("/samplers/{id}", put_sampler)
    app.router.add_get("/status.json", get_status_json)
    app.router.add_get("/status", get_status_page)
    app.router.add_get("/", get_status_page)
    return app
