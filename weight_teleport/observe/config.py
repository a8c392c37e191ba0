"""Where a publisher's or subscriber's metrics go: a dataclass, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class MetricsConfig:
    """Prometheus metrics of one `Publisher` or `Subscriber`. Each instance always keeps
    its metrics in a registry (`.metrics.registry`); these fields say who else sees them."""

    port: int | None = None
    """Serve this instance's metrics on http://HOST:PORT/metrics from a thread of its own
    (0: any free port; `.metrics.url` says which). None: no server of its own."""
    host: str = "127.0.0.1"
    """Address of that server; "0.0.0.0" lets other machines scrape it."""
    registry: Any = None
    """A `prometheus_client.CollectorRegistry` the host process already serves (its
    default `prometheus_client.REGISTRY` included): the metrics are registered there
    instead of in a registry of their own. One publisher and one subscriber at most per
    registry (their names would repeat). None: a registry of their own."""
