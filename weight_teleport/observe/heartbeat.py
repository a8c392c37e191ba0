"""The sampler's heartbeat: its position, sent to an HTTP origin from a thread of its own.

Nothing here runs on `Subscriber.apply()`'s path but `nudge()` (an Event set). Every
request is bounded by `timeout_s`; a failing origin is retried with a doubling backoff
(up to `MAX_BACKOFF_S`) and logged once per backoff step, never raised."""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import socket
import ssl
import threading
from collections.abc import Callable
from urllib.parse import quote, urlsplit

from weight_teleport.observe.logs import Repeats, kv

log = logging.getLogger("weight_teleport.pipeline.heartbeat")

MAX_BACKOFF_S = 60.0
MAX_ERROR_CHARS = 500
"""A report's `last_error` is cut to this length (the origin refuses longer ones)."""


def default_sampler_id() -> str:
    """HOST-PID: unique per process on a host."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Heartbeat:
    """PUTs `position()` (plus the sampler id) to `URL/samplers/ID` every `interval_s`,
    and soon after each `nudge()`."""

    def __init__(
        self,
        url: str,
        sampler_id: str,
        interval_s: float,
        position: Callable[[], dict],
        token: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = 2.0,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"heartbeats go to an http(s):// origin, not {url!r}")
        self.sampler_id, self.interval_s = sampler_id, interval_s
        self._path = f"{parts.path.rstrip('/')}/samplers/{quote(sampler_id, safe='')}"
        self._netloc = (parts.hostname, parts.port)
        self._tls = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._position, self.timeout_s = position, min(timeout_s, max(0.1, interval_s))
        self._wake, self._stop = threading.Event(), threading.Event()
        self._failures = Repeats()
        self.sent = 0
        """Heartbeats the origin accepted."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="weight-teleport-heartbeat")
        self._thread.start()

    def nudge(self) -> None:
        """Send soon (the position changed): never blocks."""
        self._wake.set()

    def close(self) -> None:
        """Stop; a request in flight is left to its timeout (the thread is a daemon)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=0.5)

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._send()
            except Exception as exc:  # the origin's problem, never the sampler's
                delay = min(MAX_BACKOFF_S, max(self.interval_s, 2 * delay))
                if self._failures.should_log():
                    log.warning(
                        "%s",
                        kv(
                            "heartbeat_failed",
                            sampler=self.sampler_id,
                            attempts=self._failures.count,
                            retry_in_s=delay,
                            error=f"{type(exc).__name__}: {exc}",
                        ),
                    )
                continue
            delay = self.interval_s
            self.sent += 1
            failed = self._failures.reset()
            if failed:
                log.warning("%s", kv("heartbeat_recovered", sampler=self.sampler_id, failed_attempts=failed))

    def _body(self) -> bytes:
        report = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self._position().items()
        }
        error = report.get("last_error")
        if error:
            report["last_error"] = error[:MAX_ERROR_CHARS]
        report["interval_s"] = self.interval_s
        return json.dumps(report).encode()

    def _send(self) -> None:
        body = self._body()
        conn: http.client.HTTPConnection
        if self._tls is not None:
            conn = http.client.HTTPSConnection(*self._netloc, timeout=self.timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(*self._netloc, timeout=self.timeout_s)
        try:
            conn.request("PUT", self._path, body=body, headers=self._headers)
            resp = conn.getresponse()
            text = resp.read(4096)
            if resp.status >= 300:
                raise ConnectionError(f"HTTP {resp.status} {text.decode('utf-8', 'replace').strip()[:200]}")
        finally:
            conn.close()


def heartbeat_for(url: str, config, position: Callable[[], dict]) -> Heartbeat | None:
    """The heartbeat a subscriber of `url` with `config` (SubscriberConfig) sends, or None:
    to `config.report_to`, else to `url` itself when it is an http(s):// origin."""
    target = config.report_to or (url if url.startswith(("http://", "https://")) else None)
    if target is None or config.heartbeat_s is None:
        return None
    store = config.store
    return Heartbeat(
        target,
        config.sampler_id or default_sampler_id(),
        config.heartbeat_s,
        position,
        token=store.read_token or store.token,
        ca_file=store.ca_file,
    )
