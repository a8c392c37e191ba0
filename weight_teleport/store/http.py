"""`http://host:port/prefix`: a client of the origin server (`weight-teleport serve`).

Reads resolve a key to its content-addressed URL once (`/o/KEY` answers 307 with the
content hash) and then fetch `/b/HASH/KEY`, which any HTTP cache may keep forever.
Uploads carry the upload token, reads the read token where the origin wants one;
`watch` long-polls `/watch`. `https://` verifies the origin's certificate
(`StoreConfig.ca_file` for a private authority). Every response body is read with a
bound: an object's by `get(key, max_bytes)`, a range's by its length (a Range request
answered with the whole object is read no further), the rest by `max_manifest_bytes`.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections import OrderedDict
from urllib.parse import quote, urlencode, urlsplit

from .base import UNCONDITIONAL, IfMatch, Store, too_large
from .config import StoreConfig
from .errors import (
    AuthError,
    Conflict,
    ManifestChanged,
    NotFound,
    RangeIgnored,
    StoreError,
    StoreFull,
    TooLarge,
    TransportError,
)
from .keys import content_hash

_RESOLVED_KEYS = 4096  # key -> content hash entries remembered per store
_WATCH_SLICE_S = 30.0  # longest single long-poll request
_ERROR_BODY = 64 << 10  # the most of an error response's body read (its message)
_RETRY_AFTER_MAX_S = 60.0  # the longest a Retry-After header makes a watch wait
_PAGES = {
    "/status": "status page",
    "/status.json": "status document",
    "/metrics": "metrics",
    "/healthz": "readiness probe",
    "/manifest": "manifest",
    "/watch": "long-poll",
}
"""Routes of the origin, by what they are: an address ending in one is not a store URL."""
UPLOAD_TOKEN_HINT = (
    "the origin's upload token: --token-file FILE or WEIGHT_TELEPORT_TOKEN "
    "on the command line, StoreConfig(token=...) in Python"
)
READ_TOKEN_HINT = (
    "the origin's read token: --read-token-file FILE or "
    "WEIGHT_TELEPORT_READ_TOKEN on the command line, "
    "StoreConfig(read_token=...) in Python"
)


class _BodyTooLarge(Exception):
    """A response body went past its bound (the connection is dropped)."""


class HttpStore(Store):
    """A store served by the origin server over HTTP(S), with keep-alive connections."""

    parallel_ranges = True

    def __init__(self, url: str, config: StoreConfig | None = None):
        super().__init__(config)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StoreError(f"invalid origin URL {url!r}: expected http://host:port/path")
        self._tls = ssl.create_default_context(cafile=self.config.ca_file) if parts.scheme == "https" else None
        self._netloc = (parts.hostname, parts.port)
        self._base = parts.path.rstrip("/")
        self.url = f"{parts.scheme}://{parts.netloc}{self._base}"
        """The origin's base URL, as errors name it."""
        for route, what in _PAGES.items():
            if self._base.endswith(route):
                raise StoreError(
                    f"{url} is the address of the origin's {what}, not of the store: "
                    f"use {self.url[: len(self.url) - len(route)] or '/'}"
                )
        self._origin_checked = False
        self._local = threading.local()
        self._hashes: OrderedDict[str, str] = OrderedDict()
        self._hashes_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None) -> "HttpStore":
        """Open `http://host:port/prefix` (the origin's base URL)."""
        return cls(url, config)

    # Transport.
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._tls is not None:
                conn = http.client.HTTPSConnection(*self._netloc, timeout=self.config.timeout_s, context=self._tls)
            else:
                conn = http.client.HTTPConnection(*self._netloc, timeout=self.config.timeout_s)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _request(
        self,
        method: str,
        path: str,
        body=None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        limit: int | None = None,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """Send one request; reconnect at once if a kept-alive connection went stale.

        The body of a successful answer is read up to `limit` bytes (None: all of it);
        more raises _BodyTooLarge.
        """
        return self._reconnecting(self._send, method, path, body, headers or {}, timeout, limit)

    def _reconnecting(self, send, *args):
        """`send(*args)`, sent again at once if it failed on a kept-alive connection (the
        server may have closed it while it was idle)."""
        reused = getattr(self._local, "conn", None) is not None
        try:
            return send(*args)
        except TransportError:
            if not reused:
                raise
        return send(*args)

    def _send(
        self, method: str, path: str, body, headers: dict[str, str], timeout: float | None, limit: int | None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        def read(resp: http.client.HTTPResponse):
            if resp.status >= 400:
                return resp.status, resp.headers, self._read_error(resp)
            return resp.status, resp.headers, self._read(resp, limit)

        return self._exchange(method, path, body, headers, timeout, read)

    def _exchange(self, method: str, path: str, body, headers: dict[str, str], timeout: float | None, read):
        """`read(response)` of one request on this thread's connection. A network failure
        drops the connection and raises TransportError; an unverified certificate raises
        StoreError with what to do."""
        conn = self._connection()
        conn.timeout = timeout or self.config.timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        try:
            conn.request(method, self._base + path, body=body, headers=headers)
            return read(conn.getresponse())
        except ssl.SSLCertVerificationError as exc:
            self._drop_connection()
            raise StoreError(
                f"{method} {path}: the origin's certificate was not verified "
                f"({exc.verify_message}); if a private authority signed it, pass its "
                f"certificate: --ca-file FILE on the command line, StoreConfig(ca_file=...) "
                f"in Python"
            ) from None
        except ConnectionRefusedError:
            self._drop_connection()
            raise TransportError(
                f"{method} {path}: connection refused: is the origin running "
                f"at {self.url}? (`weight-teleport serve` starts one)"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            raise TransportError(f"{method} {self.url}{path} failed: {exc!r}") from exc

    def _read(self, resp: http.client.HTTPResponse, limit: int | None) -> bytes:
        """The body, if it has at most `limit` bytes; a declared length is checked
        before anything is read, a chunked body while it streams in."""
        if limit is None or (resp.length is not None and resp.length <= limit):
            return resp.read()  # http.client never reads past Content-Length
        if resp.length is None:
            body = bytearray()
            while piece := resp.read(min(1 << 20, limit + 1 - len(body))):
                body += piece
                if len(body) > limit:
                    break
            else:
                return bytes(body)
        self._drop_connection()  # the rest of the body is never read
        raise _BodyTooLarge

    def _read_error(self, resp: http.client.HTTPResponse) -> bytes:
        """The start of an error answer's body (its message)."""
        try:
            return self._read(resp, _ERROR_BODY)
        except _BodyTooLarge:
            return b"(an error body too long to read)"

    def _check(self, status: int, body: bytes, what: str, write: bool = False) -> None:
        """Raise the store error that matches an unsuccessful status."""
        if status < 400:
            return
        reason = body.decode("utf-8", "replace").strip()[:200]
        message = f"{what}: HTTP {status} {reason}"
        if status == 404:
            raise NotFound(message)
        if status in (401, 403):
            hint = UPLOAD_TOKEN_HINT if write else READ_TOKEN_HINT
            raise AuthError(f"{message}; {'uploads' if write else 'reads'} need {hint}")
        if status == 409:
            raise Conflict(message)
        if status == 412:
            raise ManifestChanged(message)
        if status == 413:
            raise TooLarge(message)
        if status == 507:
            raise StoreFull(message)
        if status in (408, 429) or status >= 500:
            raise TransportError(message)
        raise StoreError(message)

    def _auth(self, write: bool = False) -> dict[str, str]:
        """Writes carry the upload token; reads the read token, else the upload token."""
        token = self.config.token if write else self.config.read_token or self.config.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _get_small(self, path: str, what: str) -> tuple[int, http.client.HTTPMessage, bytes]:
        """GET a manifest-sized answer (the manifest, a listing, a long-poll)."""
        try:
            return self._request("GET", path, headers=self._auth(), limit=self.config.max_manifest_bytes)
        except _BodyTooLarge:
            raise TooLarge(
                f"{what}: the origin's answer is larger than "
                f"StoreConfig.max_manifest_bytes ({self.config.max_manifest_bytes})"
            ) from None

    def _blob_path(self, key: str) -> str:
        """The content-addressed path of `key`, asking the origin once."""
        with self._hashes_lock:
            digest = self._hashes.get(key)
        if digest is None:
            status, headers, body = self._get_small("/o/" + quote(key), f"resolve {key!r}")
            self._check(status, body, f"resolve {key!r}")
            digest = headers.get("X-Content-Tree-SHA256", "")
            if status != 307 or not digest:
                raise StoreError(
                    f"resolve {key!r}: {self._base or '/'} is not a weight-teleport origin (HTTP {status})"
                )
            with self._hashes_lock:
                self._hashes[key] = digest
                while len(self._hashes) > _RESOLVED_KEYS:
                    self._hashes.popitem(last=False)
        return f"/b/{digest}/{quote(key)}"

    def _forget(self, key: str) -> None:
        with self._hashes_lock:
            self._hashes.pop(key, None)

    def close(self) -> None:
        """Close this thread's connection."""
        self._drop_connection()

    # Primitives.
    def _put(self, key: str, data: bytes) -> None:
        self._put_with(key, data, None, None)

    def _put_with(self, key: str, data: bytes, digest: str | None, between_pieces) -> None:
        headers = {
            **self._auth(write=True),
            "Content-Type": "application/octet-stream",
            "Content-Length": str(len(data)),
            "X-Content-Tree-SHA256": digest or content_hash(data),
        }
        progress = self.config.upload_progress
        body = data if progress is None and between_pieces is None else _Pieces(data, progress, between_pieces)
        status, _, body = self._request("PUT", "/o/" + quote(key), body, headers)
        self._check(status, body, f"put {key!r}", write=True)

    def _fetch(self, key: str, max_bytes: int | None = None) -> bytes:
        try:
            status, _, body = self._request("GET", self._blob_path(key), headers=self._auth(), limit=max_bytes)
        except _BodyTooLarge:
            assert max_bytes is not None  # raised only past a limit
            raise too_large(key, max_bytes) from None
        if status == 404:
            self._forget(key)  # deleted (and perhaps rewritten) since it was resolved
        self._check(status, body, f"get {key!r}")
        return body

    def _get(self, key: str) -> bytes:
        return self._fetch(key)

    def _get_at_most(self, key: str, max_bytes: int) -> bytes:
        return self._fetch(key, max_bytes)

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        def read(resp: http.client.HTTPResponse, count: int) -> bytes:
            body = bytearray()
            while len(body) < count and (piece := resp.read(min(1 << 20, count - len(body)))):
                body += piece
            return bytes(body)

        return self._ranged(key, start, end - start, read, b"")

    def _get_range_into(self, key: str, start: int, out) -> int:
        """The range's body read straight into `out` by the socket (no `bytes` of its size)."""
        view = memoryview(out).cast("B")

        def read(resp: http.client.HTTPResponse, count: int) -> int:
            got = 0
            while got < count and (n := resp.readinto(view[got:count])):
                got += n
            return got

        return self._ranged(key, start, len(view), read, 0)

    def _ranged(self, key: str, start: int, count: int, read, nothing):
        """`read(response, count)` of a GET of bytes [start, start + count) of `key`, which
        reads at most `count` bytes of the body. From a 206 answer, that is the range (a
        longer one is refused); from a 200 (a cache or proxy that ignored Range) it is the
        object's first bytes: the range where it starts at 0, else RangeIgnored. The rest
        of a body is never read. `nothing` for a range past the object's end (416)."""
        headers = {**self._auth(), "Range": f"bytes={start}-{start + count - 1}"}
        path = self._blob_path(key)

        def answer(resp: http.client.HTTPResponse):
            if resp.status not in (200, 206):
                body = self._read_error(resp)
                if resp.status == 404:
                    self._forget(key)
                if resp.status == 416:
                    return nothing
                self._check(resp.status, body, f"get {key!r}")
                raise StoreError(f"get {key!r}: unexpected HTTP {resp.status}")
            partial = resp.status == 206
            if not partial and start > 0:
                self._drop_connection()
                raise RangeIgnored(
                    f"get {key!r}: bytes from {start} were asked and the answer is the whole "
                    f"object (HTTP 200): a cache or proxy in front of the origin ignores "
                    f"Range requests (or the store is hostile); refused, not read through"
                )
            if partial and resp.length is not None and resp.length > count:
                raise _BodyTooLarge
            data = read(resp, count)
            if resp.length if resp.length is not None else resp.read(1):  # more than asked
                self._drop_connection()
                if partial:
                    raise _BodyTooLarge
            return data

        try:
            return self._reconnecting(self._exchange, "GET", path, None, headers, None, answer)
        except _BodyTooLarge:
            self._drop_connection()
            raise TransportError(f"get {key!r}: the origin answered a range with more bytes than asked") from None

    def _list(self, prefix: str) -> list[str]:
        what = f"list {prefix!r}"
        status, _, body = self._get_small("/list?" + urlencode({"prefix": prefix}), what)
        self._check(status, body, what)
        return json.loads(body)["keys"]

    def _delete(self, key: str) -> None:
        status, _, body = self._request("DELETE", "/o/" + quote(key), headers=self._auth(write=True))
        self._check(status, body, f"delete {key!r}", write=True)
        self._forget(key)

    def _put_manifest(self, data: bytes, if_match: IfMatch = UNCONDITIONAL) -> None:
        headers = self._auth(write=True)
        if if_match is None:
            headers["If-None-Match"] = "*"
        elif if_match is not UNCONDITIONAL:
            headers["If-Match"] = f'"{if_match}"'
        status, _, body = self._request("PUT", "/manifest", data, headers)
        self._check(status, body, "put manifest", write=True)

    def _get_manifest(self) -> bytes | None:
        status, _, body = self._get_small("/manifest", "get manifest")
        if status == 404:
            self._check_origin()
            return None
        self._check(status, body, "get manifest")
        return body

    def _check_origin(self) -> None:
        """Raise StoreError unless the URL is an origin's (its readiness probe answers):
        a wrong address must not read as a store where nothing was published yet."""
        if self._origin_checked:
            return
        status, _, body = self._get_small("/healthz", "readiness probe")
        if status != 200 or body != b"ok":
            raise StoreError(
                f"{self.url} is not the address of a weight-teleport origin "
                f"(GET {self._base}/healthz answered HTTP {status}): give the "
                f"base URL the origin serves, as `weight-teleport serve` prints it"
            )
        self._origin_checked = True

    def get_status(self, query: str = "") -> dict | None:
        """The origin's status document (`/status.json?QUERY`: versions, samplers); None
        from an origin that serves none."""
        status, _, body = self._retry(self._get_small, "/status.json" + (f"?{query}" if query else ""), "get status")
        if status == 404:
            return None
        self._check(status, body, "get status")
        return json.loads(body)

    def _check_write(self) -> None:
        """Ask the origin whether the upload token may upload (it writes nothing); an
        origin too old to answer (404) is left to the first upload."""
        status, _, body = self._request("GET", "/auth/upload", headers=self._auth(write=True))
        if status != 404:
            self._check(status, body, "check upload access", write=True)

    def _watch(self, after: str | None, deadline: float) -> bytes | None:
        """Long-poll the origin until the manifest changes or the deadline passes. A
        long-poll the origin ended early to spare its connection (`Retry-After`) is sent
        again only after the time it names."""
        while (remaining := deadline - time.monotonic()) > 0:
            wait = min(remaining, _WATCH_SLICE_S)
            query = urlencode({"after": after or "", "timeout": f"{wait:.3f}"})
            status, headers, body = self._retry(self._watch_once, query, wait)
            self._check(status, body, "watch")
            if status == 200:
                return body
            pause = _retry_after(headers.get("Retry-After"))
            if pause:
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        return None

    def _watch_once(self, query: str, wait: float) -> tuple[int, http.client.HTTPMessage, bytes]:
        try:
            return self._request(
                "GET",
                f"/watch?{query}",
                headers=self._auth(),
                timeout=wait + self.config.timeout_s,
                limit=self.config.max_manifest_bytes,
            )
        except _BodyTooLarge:
            raise TooLarge(
                f"watch: the origin's answer is larger than "
                f"StoreConfig.max_manifest_bytes ({self.config.max_manifest_bytes})"
            ) from None


def _retry_after(value: str | None) -> float:
    """The seconds a `Retry-After` header asks to wait (0 without one; a date, which the
    origin never sends, or nonsense counts as 1 s), at most _RETRY_AFTER_MAX_S."""
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        return 1.0
    return min(seconds, _RETRY_AFTER_MAX_S) if seconds >= 0 else 1.0


class _Pieces:
    """An upload body sent in 8 MiB pieces, each reported to `progress` once sent, with
    `between` called before every piece but the first; iterable again on a retry."""

    PIECE = 8 << 20

    def __init__(self, data: bytes, progress, between):
        self.data, self.progress, self.between = memoryview(data), progress, between

    def __iter__(self):
        for start in range(0, len(self.data), self.PIECE):
            if start and self.between is not None:
                self.between()
            piece = self.data[start : start + self.PIECE]
            yield piece
            if self.progress is not None:
                self.progress(len(piece))
