"""Run the origin: in the foreground (`weight-teleport serve`) or on a background thread."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import signal
import ssl
import threading
from collections import Counter
from collections.abc import Callable

from aiohttp import web

from ..observe.logs import kv
from .app import make_app
from .config import ServerConfig
from .connections import CONNECTIONS, ConnectionLimits
from .origin import ORIGIN
from .samplers import BOOK

log = logging.getLogger(__name__)
ACCESS_LOG = logging.getLogger("weight_teleport.server.access")
ACCESS_FORMAT = 'event=request remote=%a request="%r" status=%s bytes=%b seconds=%Tf'
_SPARE_FILES = 64  # descriptors beyond the connections' (listening socket, logs, hashing)


class _GuardedSite(web.BaseSite):
    """A TCP listener whose connections go through the app's ConnectionLimits."""

    def __init__(self, runner: web.AppRunner, config: ServerConfig, tls: ssl.SSLContext | None):
        super().__init__(runner, ssl_context=tls)
        self._config = config
        self.port = config.port

    @property
    def name(self) -> str:
        return f"{self._config.scheme}://{self._config.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # made by super().start()
        limits: ConnectionLimits = self._runner.app[CONNECTIONS]  # type: ignore[attr-defined]
        self._server = await asyncio.get_running_loop().create_server(
            lambda: limits.guard(server()),
            self._config.host,
            self._config.port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=self._config.header_timeout_s if self._ssl_context else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]


def _tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    if config.tls_cert_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    return context


def _fit_file_limit(config: ServerConfig) -> ServerConfig:
    """Raise the open-file limit to two per connection where the hard limit allows;
    else lower `max_connections` to what fits, and say so."""
    need = 2 * config.max_connections + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return config
    allowed = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (allowed, hard))
    if allowed >= need:
        return config
    fits = max(1, (allowed - _SPARE_FILES) // 2)
    log.warning(
        "serving at most %d connections, not %d (max_connections): the open-file "
        "limit is %d (raise it with `ulimit -n`)",
        fits,
        config.max_connections,
        allowed,
    )
    return dataclasses.replace(config, max_connections=fits)


async def _start(config: ServerConfig) -> tuple[web.AppRunner, int]:
    config = _fit_file_limit(config)
    tls = _tls_context(config)
    app = make_app(config)
    # Lingering: after an early answer (413, 408, 507), the rest of a body is read and
    # dropped for this long, so that a client still sending gets to read the answer.
    runner = web.AppRunner(
        app,
        access_log=ACCESS_LOG,
        access_log_format=ACCESS_FORMAT,
        shutdown_timeout=1.0,
        keepalive_timeout=config.keepalive_timeout_s,
        lingering_time=min(10.0, config.body_timeout_s),
    )
    await runner.setup()
    site = _GuardedSite(runner, config, tls)
    await site.start()
    log.info(
        "%s",
        kv(
            "origin_listening",
            url=site.name,
            root=config.root,
            uploads="token" if config.token else "refused",
            reads="token" if config.read_token else "open",
        ),
    )
    return runner, site.port


async def _stop(runner: web.AppRunner) -> None:
    await runner.cleanup()
    # Lingering reads of refused uploads may outlive the cleanup's grace period.
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _serve_until_signalled(config: ServerConfig, on_ready: Callable[[str], None] | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner, port = await _start(config)
    try:
        if on_ready is not None:
            on_ready(f"{config.scheme}://{config.host}:{port}")
        await stop.wait()
    finally:
        await _stop(runner)


def serve_forever(config: ServerConfig, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM); `on_ready` hears the base URL (with
    the port bound, for `port=0`) once the server listens."""
    asyncio.run(_serve_until_signalled(config, on_ready))


class OriginServer:
    """The origin on a background thread with its own event loop.

    Use as a context manager, or call `start()` / `stop()`; `url` is its base URL.
    """

    def __init__(self, config: ServerConfig):
        self.config = config
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="weight-teleport-origin")
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        return f"{self.config.scheme}://{self.config.host}:{self.port}"

    @property
    def stats(self) -> Counter:
        """Requests served by kind ("blob_get", "blob_bytes", "upload", "watch")."""
        assert self._runner is not None, "the server is not running"
        return self._runner.app[ORIGIN].stats

    @property
    def samplers(self):
        """The samplers heard from (`samplers.Book`)."""
        assert self._runner is not None, "the server is not running"
        return self._runner.app[BOOK]

    @property
    def connection_stats(self) -> Counter:
        """Connections "refused", "evicted", cut for a "slow_head" or "stalled_write"."""
        assert self._runner is not None, "the server is not running"
        return self._runner.app[CONNECTIONS].stats

    def start(self) -> "OriginServer":
        """Start listening; returns once the port is bound."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(_start(self.config), self._loop)
        self._runner, self.port = future.result(timeout=30)
        return self

    def stop(self) -> None:
        """Close every connection and stop the thread."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(_stop(self._runner), self._loop).result(30)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> "OriginServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
