"""The origin's status: `/status.json` for scripts and the page, `/` and `/status` for
people (status_page.py renders it).

    GET /status.json?offset=0&limit=50&state=S&version=V&q=TEXT
        the store's versions, the samplers (counted by state and version, then one page of
        them, the worst first), and the series the page charts

The samplers come from their heartbeats (samplers.py); their lag is counted against the
store's latest version, so a stale sampler shows how far behind it fell."""

from __future__ import annotations

import statistics
import time
from typing import Any

from aiohttp import web

from ..observe.probe import object_problems
from ..observe.status import store_summary
from ..errors import ManifestError
from ..format.manifest import Manifest, from_json
from .origin import ORIGIN
from .samplers import BOOK, Book

MAX_PAGE = 500
DEFAULT_PAGE = 25
_WORST_FIRST = {"failing": 0, "stale": 1, "degraded": 2, "starting": 3, "healthy": 4}
CHART_VERSIONS = 100
"""Versions the charts cover (the newest)."""


def _manifest(request: web.Request) -> tuple[Manifest | None, str | None]:
    """The store's manifest as the origin holds it, and why it is unreadable (if it is)."""
    current = request.app[ORIGIN].manifest.current()
    if current is None:
        return None, None
    try:
        return from_json(current[0]), None
    except ManifestError as exc:
        return None, str(exc)


def _int_arg(request: web.Request, name: str, default: int, high: int) -> int:
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer") from None
    if not 0 <= value <= high:
        raise web.HTTPBadRequest(text=f"{name} must be in [0, {high}]")
    return value


def samplers_section(
    book: Book,
    latest: int | None,
    *,
    offset: int = 0,
    limit: int = DEFAULT_PAGE,
    state: str | None = None,
    version: int | None = None,
    query: str = "",
) -> dict:
    """Counts of every sampler by state and version, and one page of the matching ones,
    the worst first (failing, stale, degraded...; then the most behind)."""
    book.sweep()
    now, wall = time.monotonic(), time.time()
    rows: list[dict[str, Any]] = []
    for s in book.samplers.values():
        r = s.report
        behind = None if latest is None or r.version is None else max(0, latest - r.version)
        rows.append(
            {
                "id": s.id,
                "state": book.state(s, now),
                "version": r.version,
                "versions_behind": behind,
                "lag_s": r.lag_s,
                "pause_s": r.pause_s,
                "ready_s": r.ready_s,
                "last_error": r.last_error,
                "resyncs": r.resyncs,
                "heard_s_ago": round(now - s.heard, 3),
                "first_heard": s.first_heard_wall,
                "since_s": round(wall - s.first_heard_wall, 1),
            }
        )
    by_state, by_version = {k: 0 for k in _WORST_FIRST}, dict[str, int]()
    for row in rows:
        by_state[row["state"]] = by_state.get(row["state"], 0) + 1
        key = "none" if row["version"] is None else str(row["version"])
        by_version[key] = by_version.get(key, 0) + 1
    matched = [
        r
        for r in rows
        if (state is None or r["state"] == state) and (version is None or r["version"] == version) and query in r["id"]
    ]
    matched.sort(key=lambda r: (_WORST_FIRST.get(r["state"], 9), -(r["versions_behind"] or 0), r["id"]))
    return {
        "total": len(rows),
        "by_state": by_state,
        "by_version": dict(sorted(by_version.items(), key=lambda kv: kv[0])),
        "matched": len(matched),
        "offset": offset,
        "limit": limit,
        "items": matched[offset : offset + limit],
    }


def charts(book: Book, store: dict) -> dict:
    """The page's series: bytes per version, publish -> ready per version (the median
    over the samplers that reported it), and each pause over time."""
    versions = store["versions"][-CHART_VERSIONS:]
    ready: dict[int, list[float]] = {}
    pauses = []
    for wall, _sid, version, pause_s, ready_s in book.updates:
        if ready_s is not None:
            ready.setdefault(version, []).append(ready_s)
        if pause_s is not None:
            pauses.append([round(wall, 3), pause_s])
    return {
        "bytes_per_version": [[v["version"], v["wire_bytes"], v["anchor"]] for v in versions],
        "ready_per_version": [[v, statistics.median(s)] for v, s in sorted(ready.items())][-CHART_VERSIONS:],
        "pauses": pauses[-1000:],
    }


def status_document(request: web.Request) -> dict:
    """The whole status, as /status.json serves it."""
    q = request.query
    manifest, unreadable = _manifest(request)
    origin = request.app[ORIGIN]
    store = store_summary(manifest, problems=None if manifest is None else object_problems(origin.store, manifest))
    if unreadable:
        store["error"] = f"the store's manifest is unreadable: {unreadable}"
    state = q.get("state") or None
    version = _int_arg(request, "version", 0, 1 << 62) if q.get("version") else None
    book = request.app[BOOK]
    samplers = samplers_section(
        book,
        store["latest"],
        offset=_int_arg(request, "offset", 0, 1 << 31),
        limit=_int_arg(request, "limit", DEFAULT_PAGE, MAX_PAGE),
        state=state,
        version=version,
        query=q.get("q", "")[:128],
    )
    config = origin.config
    return {
        "now": time.time(),
        "store": store,
        "samplers": samplers,
        "charts": charts(book, store),
        "origin": {
            "sampler_stale_s": config.sampler_stale_s,
            "sampler_expiry_s": config.sampler_expiry_s,
            "uploads": config.token is not None,
            "read_token": config.read_token is not None,
        },
    }


async def get_status_json(request: web.Request) -> web.Response:
    return web.json_response(status_document(request), headers={"Cache-Control": "no-store"})


async def get_status_page(request: web.Request) -> web.Response:
    from .status_page import render

    return web.Response(
        text=render(status_document(request)), content_type="text/html", headers={"Cache-Control": "no-store"}
    )
