"""Connection limits of the origin: a cap on open connections, slots that reads cannot
hold, a deadline for request heads, a bound on responses left unread.

aiohttp bounds none of these (a client may trickle a request's headers for as long as
its keep-alive timer allows, and connections are accepted until file descriptors run
out). Each accepted connection gets a `Guard`, an asyncio protocol in front of aiohttp's
own; the `track_connections` middleware tells it while a request is being handled (from
its complete head to its handler's end), so the guard knows which connections are idle.
Request bodies are bounded where they are read (`origin.receive`).

Reads (requests without the upload token, /healthz excepted: anyone who reaches the
origin may send them) hold at most `max_connections - reserve` slots at once, so that
long-polls and downloads nobody reads cannot lock out the publisher's writes and the
health probes. A long-poll gives its slot up whenever another request needs it, and a
long-poll that finds no slot is answered at once: both get their answer (304, or the new
manifest) with `Retry-After: 1` and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..observe.logs import kv
from .config import ServerConfig
from .tokens import bearer, matches

log = logging.getLogger(__name__)

RESERVED_PATHS = ("/healthz",)
"""Paths whose requests may use the reserved slots without the upload token."""
POLL_PATHS = ("/watch",)
"""Paths of long-polls: a request there gives its slot up when another request needs it."""


def _status(code: str, text: str) -> bytes:
    body = text.encode()
    return (
        f"HTTP/1.1 {code}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Connection: close\r\nRetry-After: 1\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


_BUSY = _status(
    "503 Service Unavailable",
    "every connection slot is busy with a request (ServerConfig.max_connections); retry shortly",
)
_SLOW_HEAD = _status(
    "408 Request Timeout", "the request line and headers took too long (ServerConfig.header_timeout_s)"
)


class ConnectionLimits:
    """The open connections of one server, and the limits they are held to."""

    def __init__(self, config: ServerConfig):
        self.max_connections = config.max_connections
        self.read_slots = config.max_connections - config.reserve
        self.token = config.token
        self.header_timeout_s = config.header_timeout_s
        self.write_stall_s = config.body_timeout_s
        self._open: dict[asyncio.BaseTransport, Guard] = {}
        self._idle: OrderedDict[Guard, None] = OrderedDict()
        """The connections between requests, the longest idle first."""
        self._reads: set[Guard] = set()
        """The connections whose request holds one of the reads' slots."""
        self._polls: OrderedDict[Guard, None] = OrderedDict()
        """The long-polls among them, the oldest first."""
        self.stats: Counter = Counter()
        """Connections "refused" (503), "evicted" (idle, for a new one), cut for a
        "slow_head" or a "stalled_write"; reads answered 503 for want of a slot ("busy"),
        long-polls answered early to free or spare a slot ("poll_ended")."""

    def guard(self, inner: asyncio.Protocol) -> "Guard":
        """A guard in front of aiohttp's protocol for one new connection."""
        return Guard(inner, self)

    def guard_of(self, transport: asyncio.BaseTransport | None) -> "Guard | None":
        """The guard of an open connection (None for a connection not guarded)."""
        return self._open.get(transport) if transport is not None else None

    def admit(self, guard: "Guard") -> bool:
        """Count a new connection in; at the limit, close the longest idle one first, else
        end the oldest long-poll. False if every connection is busy with another request."""
        if len(self._open) >= self.max_connections:
            victim = next((g for g in self._idle if not g.flushing()), None)
            if victim is not None:
                victim.cut("evicted")
            elif self._polls:
                poll = next(iter(self._polls))
                self._end_poll(poll)
                self.forget(poll)  # its connection closes once the answer is out
            else:
                self.stats["refused"] += 1
                return False
        assert guard.transport is not None  # set by connection_made, which admits
        self._open[guard.transport] = guard
        self._idle[guard] = None
        return True

    def forget(self, guard: "Guard") -> None:
        """Count a closed connection out."""
        if guard.transport is not None:
            self._open.pop(guard.transport, None)
        self._idle.pop(guard, None)
        self._reads.discard(guard)
        self._polls.pop(guard, None)

    def begin(self, guard: "Guard", request: web.Request) -> bool:
        """Count a request in once its head is complete. False for a read that finds no
        slot of the reads free, none being freed by ending a long-poll: it gets 503. A
        long-poll always runs; `guard.poll_over` tells it when to end."""
        self._idle.pop(guard, None)
        if request.path in RESERVED_PATHS or matches(bearer(request), self.token):
            return True
        poll_over = guard.poll_over = asyncio.Event() if request.path in POLL_PATHS else None
        poll = poll_over is not None
        if len(self._reads) >= self.read_slots and (poll or not self._end_oldest_poll()):
            if poll_over is not None:
                poll_over.set()
                self.stats["poll_ended"] += 1
            else:
                self.stats["busy"] += 1
            return poll
        self._reads.add(guard)
        if poll:
            self._polls[guard] = None
        return True

    def end(self, guard: "Guard") -> None:
        """Count a request out: its connection is idle."""
        self._reads.discard(guard)
        self._polls.pop(guard, None)
        guard.poll_over = None
        if guard.transport in self._open:
            self._idle[guard] = None

    def _end_oldest_poll(self) -> bool:
        """End the oldest long-poll, which frees its slot; False if there is none."""
        if not self._polls:
            return False
        self._end_poll(next(iter(self._polls)))
        return True

    def _end_poll(self, guard: "Guard") -> None:
        self._polls.pop(guard, None)
        self._reads.discard(guard)
        if guard.poll_over is not None:
            guard.poll_over.set()
        self.stats["poll_ended"] += 1


class Guard(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's protocol, and closes the
    connection when it breaks a limit."""

    def __init__(self, inner: asyncio.Protocol, limits: ConnectionLimits):
        self.inner, self.limits = inner, limits
        self.transport: asyncio.Transport | None = None
        self._admitted = self._busy = False
        self.poll_over: asyncio.Event | None = None
        """Set when this connection's long-poll must end now (None: no long-poll)."""
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol, forwarded.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.limits.admit(self):
            transport.write(_BUSY)  # type: ignore[attr-defined]
            transport.close()
            return
        self._admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._busy and self._head_timer is None:
            # The first bytes of a request: its head must be complete within the timeout.
            self._head_timer = asyncio.get_running_loop().call_later(self.limits.header_timeout_s, self._head_timed_out)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self.limits.forget(self)
        if self._admitted:
            self._admitted = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_timer = asyncio.get_running_loop().call_later(self.limits.write_stall_s, self.cut, "stalled_write")
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self.inner.resume_writing()

    # Request boundaries, from the middleware.
    def begin_request(self, request: web.Request) -> bool:
        """The request's head is complete; False if it gets no slot (`ConnectionLimits.begin`)."""
        self._busy = True
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        return self.limits.begin(self, request)

    def end_request(self) -> None:
        self._busy = False
        self.limits.end(self)

    def flushing(self) -> bool:
        """Whether a response is still being written out."""
        return self.transport is not None and self.transport.get_write_buffer_size() > 0

    def cut(self, why: str) -> None:
        """Close the connection now, for the reason `why` (a stats key); a client cut for
        not reading is logged, in one line."""
        self.limits.stats[why] += 1
        if why == "stalled_write":
            peer = self.transport.get_extra_info("peername") if self.transport else None
            log.warning(
                "%s", kv("connection_cut", reason=why, remote=peer and peer[0], stall_s=self.limits.write_stall_s)
            )
        self.limits.forget(self)
        self._cancel_timers()
        if self.transport is not None:
            self.transport.abort()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._busy or self.transport is None:
            return
        self.limits.stats["slow_head"] += 1
        self.limits.forget(self)
        self.transport.write(_SLOW_HEAD)
        self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._write_timer = None


CONNECTIONS = web.AppKey("connections", ConnectionLimits)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def track_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Mark the request's connection busy while its handler runs; 503 for a read that finds
    no slot."""
    guard = request.app[CONNECTIONS].guard_of(request.transport)
    if guard is None:
        return await handler(request)
    admitted = guard.begin_request(request)
    try:
        if not admitted:
            busy = web.HTTPServiceUnavailable(
                text="every connection slot that reads may hold is busy "
                "(ServerConfig.max_connections, reserved_connections); retry shortly",
                headers={"Retry-After": "1"},
            )
            busy.force_close()
            raise busy
        return await handler(request)
    finally:
        guard.end_request()


def poll_over(request: web.Request) -> asyncio.Event | None:
    """The event that ends the request's long-poll early (None: an unguarded connection)."""
    guard = request.app[CONNECTIONS].guard_of(request.transport)
    return guard.poll_over if guard is not None else None
