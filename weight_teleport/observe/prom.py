"""A registry per publisher or subscriber, and its optional HTTP endpoint."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.exposition import generate_latest

from weight_teleport.observe.config import MetricsConfig
from weight_teleport.observe.logs import kv

log = logging.getLogger(__name__)

NAMESPACE = "weight_teleport"
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Buckets of the seconds histograms: a millisecond pause to a two-minute anchor upload."""


class Exposed:
    """The registry an instance's metrics live in, and the HTTP server that serves them
    when `MetricsConfig.port` asks for one."""

    def __init__(self, config: MetricsConfig | None, what: str):
        config = config or MetricsConfig()
        self.registry = config.registry if config.registry is not None else CollectorRegistry()
        self._server = None
        self.url: str | None = None
        """http://HOST:PORT/metrics where this instance serves its metrics, or None."""
        if config.port is not None:
            self._server, _ = start_http_server(config.port, config.host, self.registry)
            self.url = f"http://{config.host}:{self._server.server_port}/metrics"
            log.info("%s", kv("metrics_serving", of=what, url=self.url))

    def text(self) -> str:
        """The exposition text of the registry (what a scrape gets)."""
        return generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop the HTTP server, if any."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
