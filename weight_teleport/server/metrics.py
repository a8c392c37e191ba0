"""The origin's Prometheus metrics, served on `/metrics`: requests by route and status,
bytes served, uploads refused, long-polls open, samplers known."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..observe.prom import NAMESPACE, SECONDS_BUCKETS
from .connections import Handler
from .samplers import BOOK

_WRITES = ("PUT", "POST", "DELETE")


class OriginMetrics:
    """The metrics of one origin, in a registry of its own (several origins may share a
    process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        opts: dict[str, Any] = dict(namespace=NAMESPACE, subsystem="origin", registry=self.registry)
        self.requests = Counter(
            "requests",
            "Requests answered, by route, method and status.",
            labelnames=("route", "method", "status"),
            **opts,
        )
        self.seconds = Histogram(
            "request_seconds",
            "Time to answer a request (a long-poll's wait included), by route.",
            labelnames=("route",),
            buckets=SECONDS_BUCKETS,
            **opts,
        )
        self.served = Counter("served_bytes", "Response body bytes sent, by route.", labelnames=("route",), **opts)
        self.received = Counter("received_bytes", "Upload bytes stored.", **opts)
        self.refused = Counter(
            "uploads_refused",
            "Writes refused (PUT, POST, DELETE with a 4xx/5xx answer), by status.",
            labelnames=("status",),
            **opts,
        )
        self.watchers = Gauge("watchers", "Long-polls (/watch) open now.", **opts)
        self.samplers = Gauge(
            "samplers", "Samplers known from their heartbeats, by state.", labelnames=("state",), **opts
        )

    def observe(self, request: web.Request, status: int, nbytes: int, seconds: float) -> None:
        route = _route(request)
        self.requests.labels(route, request.method, str(status)).inc()
        self.seconds.labels(route).observe(seconds)
        if nbytes:
            self.served.labels(route).inc(nbytes)
        if request.method in _WRITES:
            if status >= 400:
                self.refused.labels(str(status)).inc()
            elif request.content_length:
                self.received.inc(request.content_length)


def _route(request: web.Request) -> str:
    """The route's pattern ("/o/{key}"), never the path: labels stay few."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


METRICS = web.AppKey("metrics", OriginMetrics)


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every answer, errors included."""
    metrics, t0 = request.app[METRICS], time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        metrics.observe(request, exc.status, 0, time.perf_counter() - t0)
        raise
    except Exception:
        metrics.observe(request, 500, 0, time.perf_counter() - t0)
        raise
    metrics.observe(request, response.status, response.content_length or 0, time.perf_counter() - t0)
    return response


async def get_metrics(request: web.Request) -> web.Response:
    """The origin's metrics in the Prometheus text format."""
    metrics = request.app[METRICS]
    for state, n in request.app[BOOK].counts().items():
        metrics.samplers.labels(state).set(n)
    return web.Response(
        body=generate_latest(metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST, "Cache-Control": "no-store"},
    )
