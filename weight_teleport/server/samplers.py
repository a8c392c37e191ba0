"""Sampler positions: the heartbeats subscribers send, kept in memory with an expiry.

    PUT /samplers/ID    a JSON report (at most MAX_REPORT_BYTES); 204. Needs the read
                        token (or the upload token) where the origin has one.

A sampler unheard for `sampler_stale_s` shows as "stale"; after `sampler_expiry_s` it is
forgotten. At most `max_samplers` are kept: a new one beyond gets 503."""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Optional

import msgspec
from aiohttp import web

from .config import ServerConfig
from .origin import ORIGIN, require_reader

MAX_REPORT_BYTES = 8 << 10
STATES = ("starting", "healthy", "degraded", "failing")
_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,127}\Z")
_SWEEP_S = 1.0
_Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]


class Report(msgspec.Struct, forbid_unknown_fields=False):
    """What a heartbeat says (`observe/heartbeat.py`); unknown members are ignored."""

    state: Annotated[str, msgspec.Meta(max_length=16)]
    version: Optional[_Count] = None
    latest: Optional[_Count] = None
    versions_behind: Optional[_Count] = None
    lag_s: Optional[_Seconds] = None
    pause_s: Optional[_Seconds] = None
    ready_s: Optional[_Seconds] = None
    last_error: Optional[Annotated[str, msgspec.Meta(max_length=2000)]] = None
    resyncs: _Count = 0
    fetched_bytes: _Count = 0
    interval_s: Optional[_Seconds] = None


_decode = msgspec.json.Decoder(Report)


@dataclass
class Sampler:
    id: str
    report: Report
    heard: float
    """time.monotonic() of the last heartbeat."""
    heard_wall: float
    first_heard_wall: float


@dataclass
class Book:
    """Every sampler heard within the expiry, and the updates they applied (for charts)."""

    stale_s: float
    expiry_s: float
    max_samplers: int
    samplers: dict[str, Sampler] = field(default_factory=dict)
    updates: deque = field(default_factory=lambda: deque(maxlen=5000))
    """(wall time, sampler id, version, pause_s, ready_s) of each new version a sampler
    reported, the newest last."""
    _swept: float = 0.0

    def hear(self, sampler_id: str, report: Report) -> bool:
        """Record a heartbeat; False when the book is full and `sampler_id` is new."""
        now, wall = time.monotonic(), time.time()
        self.sweep(now)
        old = self.samplers.get(sampler_id)
        if old is None and len(self.samplers) >= self.max_samplers:
            return False
        first = old.first_heard_wall if old else wall
        self.samplers[sampler_id] = Sampler(sampler_id, report, now, wall, first)
        if report.version is not None and (old is None or old.report.version != report.version):
            self.updates.append((wall, sampler_id, report.version, report.pause_s, report.ready_s))
        return True

    def sweep(self, now: float | None = None) -> None:
        """Forget the samplers unheard for `expiry_s` (at most once a second)."""
        now = time.monotonic() if now is None else now
        if now - self._swept < _SWEEP_S:
            return
        self._swept = now
        for sid in [s.id for s in self.samplers.values() if now - s.heard > self.expiry_s]:
            del self.samplers[sid]

    def state(self, sampler: Sampler, now: float) -> str:
        """The sampler's own state, or "stale" when it went unheard for `stale_s`."""
        return "stale" if now - sampler.heard > self.stale_s else sampler.report.state

    def counts(self) -> dict[str, int]:
        """Samplers by state (stale included)."""
        now, out = time.monotonic(), {s: 0 for s in (*STATES, "stale")}
        for s in self.samplers.values():
            out[self.state(s, now)] = out.get(self.state(s, now), 0) + 1
        return out


def make_book(config: ServerConfig) -> Book:
    return Book(config.sampler_stale_s, config.sampler_expiry_s, config.max_samplers)


BOOK = web.AppKey("samplers", Book)


async def put_sampler(request: web.Request) -> web.Response:
    """A sampler's heartbeat."""
    require_reader(request, request.app[ORIGIN].config)
    sampler_id = request.match_info["id"]
    if not _ID.match(sampler_id):
        raise web.HTTPBadRequest(
            text="a sampler id is 1-128 letters, digits and _ . : @ -, starting with a letter, digit or _"
        )
    if (request.content_length or 0) > MAX_REPORT_BYTES:
        raise web.HTTPRequestEntityTooLarge(
            max_size=MAX_REPORT_BYTES,
            actual_size=request.content_length or 0,
            text=f"a heartbeat is at most {MAX_REPORT_BYTES} bytes",
        )
    body = await request.content.read(MAX_REPORT_BYTES + 1)
    if len(body) > MAX_REPORT_BYTES:
        raise web.HTTPRequestEntityTooLarge(
            max_size=MAX_REPORT_BYTES,
            actual_size=len(body),  # at least
            text=f"a heartbeat is at most {MAX_REPORT_BYTES} bytes",
        )
    try:
        report = _decode.decode(body)
    except msgspec.DecodeError as exc:
        raise web.HTTPBadRequest(text=f"not a heartbeat report: {exc}") from None
    if report.state not in STATES:
        raise web.HTTPBadRequest(text=f"state {report.state!r} is not one of {STATES}")
    if not request.app[BOOK].hear(sampler_id, report):
        raise web.HTTPServiceUnavailable(
            text="the origin keeps no more samplers (ServerConfig.max_samplers)", headers={"Retry-After": "60"}
        )
    return web.Response(status=204, headers={"Cache-Control": "no-store"})
