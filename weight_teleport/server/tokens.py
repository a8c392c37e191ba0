"""Bearer tokens of requests (RFC 6750), compared in constant time."""

from __future__ import annotations

import hmac

from aiohttp import web


def bearer(request: web.Request) -> str | None:
    """The request's bearer token (None without one), as sent: not checked to be ASCII."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    given = given.strip()
    return given if scheme.lower() == "bearer" and given else None


def matches(given: str | None, token: str | None) -> bool:
    """Whether `given` is `token` (False when either is missing, or `given` is not ASCII:
    tokens are)."""
    return (
        given is not None
        and token is not None
        and given.isascii()
        and hmac.compare_digest(given.encode(), token.encode())
    )
