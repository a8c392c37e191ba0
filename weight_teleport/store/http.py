"""`http://host:port/prefix`: a client of the origin server (`weight-teleport serve`).

Reads resolve a key to its content-addressed URL once (`/o/KEY` answers 307 with the
content hash) and then fetch `/b/HASH/KEY`, which any HTTP cache may keep forever.
Uploads carry a bearer token; `watch` long-polls `/watch`.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import OrderedDict
from urllib.parse import quote, urlencode, urlsplit

from .base import Store
from .config import StoreConfig
from .errors import AuthError, Conflict, NotFound, StoreError, TooLarge, TransportError
from .keys import content_hash

_RESOLVED_KEYS = 4096  # key -> content hash entries remembered per store
_WATCH_SLICE_S = 30.0  # longest single long-poll request


class HttpStore(Store):
    """A store served by the origin server over HTTP(S), with keep-alive connections."""

    def __init__(self, url: str, config: StoreConfig | None = None):
        super().__init__(config)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StoreError(f"invalid origin URL {url!r}: expected http://host:port/path")
        self._https = parts.scheme == "https"
        self._netloc = (parts.hostname, parts.port)
        self._base = parts.path.rstrip("/")
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
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = kind(*self._netloc, timeout=self.config.timeout_s)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _request(self, method: str, path: str, body=None,
                 headers: dict[str, str] | None = None, timeout: float | None = None
                 ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """Send one request; reconnect at once if a kept-alive connection went stale."""
        reused = getattr(self._local, "conn", None) is not None
        try:
            return self._send(method, path, body, headers or {}, timeout)
        except TransportError:
            if not reused:
                raise
        return self._send(method, path, body, headers or {}, timeout)

    def _send(self, method: str, path: str, body, headers: dict[str, str],
              timeout: float | None) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = self._connection()
        conn.timeout = timeout or self.config.timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        try:
            conn.request(method, self._base + path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            raise TransportError(f"{method} {path} failed: {exc!r}") from exc

    def _check(self, status: int, body: bytes, what: str) -> None:
        """Raise the store error that matches an unsuccessful status."""
        if status < 400:
            return
        reason = body.decode("utf-8", "replace").strip()[:200]
        message = f"{what}: HTTP {status} {reason}"
        if status == 404:
            raise NotFound(message)
        if status in (401, 403):
            raise AuthError(f"{message} (uploads need StoreConfig.token set to the "
                            f"origin's token)")
        if status == 409:
            raise Conflict(message)
        if status == 413:
            raise TooLarge(message)
        if status in (408, 429) or status >= 500:
            raise TransportError(message)
        raise StoreError(message)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}

    def _blob_path(self, key: str) -> str:
        """The content-addressed path of `key`, asking the origin once."""
        with self._hashes_lock:
            digest = self._hashes.get(key)
        if digest is None:
            status, headers, body = self._request("GET", "/o/" + quote(key))
            self._check(status, body, f"resolve {key!r}")
            digest = headers.get("X-Content-SHA256", "")
            if status != 307 or not digest:
                raise StoreError(f"resolve {key!r}: {self._base or '/'} is not a "
                                 f"weight-teleport origin (HTTP {status})")
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
        headers = {**self._auth(), "Content-Type": "application/octet-stream",
                   "Content-Length": str(len(data)), "X-Content-SHA256": content_hash(data)}
        body = data if self.config.upload_progress is None else _Reporting(data, self.config.upload_progress)
        status, _, body = self._request("PUT", "/o/" + quote(key), body, headers)
        self._check(status, body, f"put {key!r}")

    def _fetch(self, key: str, headers: dict[str, str]) -> tuple[int, bytes]:
        status, _, body = self._request("GET", self._blob_path(key), headers=headers)
        if status == 404:
            self._forget(key)  # deleted (and perhaps rewritten) since it was resolved
        if status != 416:
            self._check(status, body, f"get {key!r}")
        return status, body

    def _get(self, key: str) -> bytes:
        return self._fetch(key, {})[1]

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        status, body = self._fetch(key, {"Range": f"bytes={start}-{end - 1}"})
        if status == 416:
            return b""  # the range starts past the end of the object
        return body if status == 206 else body[start:end]

    def _list(self, prefix: str) -> list[str]:
        status, _, body = self._request("GET", "/list?" + urlencode({"prefix": prefix}))
        self._check(status, body, f"list {prefix!r}")
        return json.loads(body)["keys"]

    def _delete(self, key: str) -> None:
        status, _, body = self._request("DELETE", "/o/" + quote(key), headers=self._auth())
        self._check(status, body, f"delete {key!r}")
        self._forget(key)

    def _put_manifest(self, data: bytes) -> None:
        status, _, body = self._request("PUT", "/manifest", data, self._auth())
        self._check(status, body, "put manifest")

    def _get_manifest(self) -> bytes | None:
        status, _, body = self._request("GET", "/manifest")
        if status == 404:
            return None
        self._check(status, body, "get manifest")
        return body

    def _watch(self, after: str | None, deadline: float) -> bytes | None:
        """Long-poll the origin until the manifest changes or the deadline passes."""
        while (remaining := deadline - time.monotonic()) > 0:
            wait = min(remaining, _WATCH_SLICE_S)
            query = urlencode({"after": after or "", "timeout": f"{wait:.3f}"})
            status, _, body = self._retry(self._request, "GET", f"/watch?{query}", None,
                                          None, wait + self.config.timeout_s)
            self._check(status, body, "watch")
            if status == 200:
                return body
        return None


class _Reporting:
    """An upload body sent in 1 MiB pieces, reporting each piece to `progress`; iterable
    again on a retry."""

    def __init__(self, data: bytes, progress):
        self.data, self.progress = memoryview(data), progress

    def __iter__(self):
        for start in range(0, len(self.data), 1 << 20):
            piece = self.data[start:start + (1 << 20)]
            yield piece
            self.progress(len(piece))
