"""Connection limits of the origin: a cap on open connections, a deadline for request
heads, a bound on responses left unread.

aiohttp bounds none of these (a client may trickle a request's headers for as long as
its keep-alive timer allows, and connections are accepted until file descriptors run
out). Each accepted connection gets a `Guard`, an asyncio protocol in front of aiohttp's
own; the `track_connections` middleware tells it while a request is being handled (from
its complete head to its handler's end), so the guard knows which connections are idle.
Request bodies are bounded where they are read (`origin.receive`).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web

from .config import ServerConfig


def _status(code: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {code}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Connection: close\r\nRetry-After: 1\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


_BUSY = _status("503 Service Unavailable", "every connection slot is busy with a request "
                                           "(ServerConfig.max_connections); retry shortly")
_SLOW_HEAD = _status("408 Request Timeout", "the request line and headers took too long "
                                            "(ServerConfig.header_timeout_s)")


class ConnectionLimits:
    """The open connections of one server, and the limits they are held to."""

    def __init__(self, config: ServerConfig):
        self.max_connections = config.max_connections
        self.header_timeout_s = config.header_timeout_s
        self.write_stall_s = config.body_timeout_s
        self._open: dict[asyncio.BaseTransport, Guard] = {}
        self._idle: OrderedDict[Guard, None] = OrderedDict()
        """The connections between requests, the longest idle first."""
        self.stats: Counter = Counter()
        """Connections "refused" (503), "evicted" (idle, for a new one), cut for a
        "slow_head" or a "stalled_write"."""

    def guard(self, inner: asyncio.Protocol) -> "Guard":
        """A guard in front of aiohttp's protocol for one new connection."""
        return Guard(inner, self)

    def guard_of(self, transport: asyncio.BaseTransport | None) -> "Guard | None":
        """The guard of an open connection (None for a connection not guarded)."""
        return self._open.get(transport) if transport is not None else None

    def admit(self, guard: "Guard") -> bool:
        """Count a new connection in; at the limit, close the longest idle one first.
        False if every connection is busy with a request."""
        if len(self._open) >= self.max_connections:
            victim = next((g for g in self._idle if not g.flushing()), None)
            if victim is None:
                self.stats["refused"] += 1
                return False
            victim.cut("evicted")
        self._open[guard.transport] = guard
        self._idle[guard] = None
        return True

    def forget(self, guard: "Guard") -> None:
        """Count a closed connection out."""
        self._open.pop(guard.transport, None)
        self._idle.pop(guard, None)

    def set_idle(self, guard: "Guard", idle: bool) -> None:
        self._idle.pop(guard, None)
        if idle and guard.transport in self._open:
            self._idle[guard] = None


class Guard(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's protocol, and closes the
    connection when it breaks a limit."""

    def __init__(self, inner: asyncio.Protocol, limits: ConnectionLimits):
        self.inner, self.limits = inner, limits
        self.transport: asyncio.Transport | None = None
        self._admitted = self._busy = False
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
            self._head_timer = asyncio.get_running_loop().call_later(
                self.limits.header_timeout_s, self._head_timed_out)
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
        self._write_timer = asyncio.get_running_loop().call_later(
            self.limits.write_stall_s, self.cut, "stalled_write")
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self.inner.resume_writing()

    # Request boundaries, from the middleware.
    def begin_request(self) -> None:
        self._busy = True
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.limits.set_idle(self, False)

    def end_request(self) -> None:
        self._busy = False
        self.limits.set_idle(self, True)

    def flushing(self) -> bool:
        """Whether a response is still being written out."""
        return self.transport is not None and self.transport.get_write_buffer_size() > 0

    def cut(self, why: str) -> None:
        """Close the connection now, for the reason `why` (a stats key)."""
        self.limits.stats[why] += 1
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
    """Mark the request's connection busy while its handler runs."""
    guard = request.app[CONNECTIONS].guard_of(request.transport)
    if guard is None:
        return await handler(request)
    guard.begin_request()
    try:
        return await handler(request)
    finally:
        guard.end_request()
