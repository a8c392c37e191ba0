"""Run the origin: in the foreground (`weight-teleport serve`) or on a background thread."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter

from aiohttp import web

from .app import make_app
from .config import ServerConfig
from .origin import ORIGIN

log = logging.getLogger(__name__)
ACCESS_LOG = logging.getLogger("weight_teleport.server.access")


async def _start(config: ServerConfig) -> tuple[web.AppRunner, int]:
    app = make_app(config)
    runner = web.AppRunner(app, access_log=ACCESS_LOG, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]
    log.info("serving %s on http://%s:%d", config.root, config.host, port)
    return runner, port


async def _stop(runner: web.AppRunner) -> None:
    await runner.cleanup()
    # Lingering reads of refused uploads may outlive the cleanup's grace period.
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def serve_forever(config: ServerConfig) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    web.run_app(make_app(config), host=config.host, port=config.port,
                access_log=ACCESS_LOG, print=None, shutdown_timeout=1.0)


class OriginServer:
    """The origin on a background thread with its own event loop.

    Use as a context manager, or call `start()` / `stop()`; `url` is its base URL.
    """

    def __init__(self, config: ServerConfig):
        self.config = config
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="weight-teleport-origin")
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        return f"http://{self.config.host}:{self.port}"

    @property
    def stats(self) -> Counter:
        """Requests served by kind ("blob_get", "blob_bytes", "upload", "watch")."""
        assert self._runner is not None, "the server is not running"
        return self._runner.app[ORIGIN].stats

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
