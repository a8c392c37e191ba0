"""The publisher's writes to its store: recorded per version, and stopped by a cancel."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from weight_teleport.observe.logs import kv
from weight_teleport.pipeline.errors import PublishCancelled
from weight_teleport.store import Store, TransportError

log = logging.getLogger(__name__)


class TrackedWrites:
    """The store as the publisher's encoder sees it: every other call passes through.
    `put` and `put_manifest` are recorded (those of the worker thread for the version in
    hand, those of other threads, the anchor's, until they announce), and refused once
    `cancel()` was called; `cancel()` returns once the writes in flight are done, so what
    it reports is what the store holds. Writes of different threads run concurrently.

    A write that fails transiently (TransportError) is tried again, with a doubling
    backoff, until `retry_for_s` seconds after its first try; a cancel ends the wait."""

    def __init__(self, store: Store, retry_for_s: float = 0.0):
        self._store, self.retry_for_s = store, retry_for_s
        self._cond = threading.Condition()
        self._cancelled = False
        self._in_flight = 0
        self._worker: int | None = None
        self.uploaded: list[str] = []
        """Keys the version in hand wrote."""
        self.announced = False
        """Whether the version in hand is in the manifest."""
        self._others: dict[int, list[str]] = {}
        """Keys other threads uploaded and did not announce yet, by thread."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def begin(self) -> None:
        """The calling thread (the worker) takes a new version in hand."""
        with self._cond:
            self._worker = threading.get_ident()
            self.uploaded, self.announced = [], False

    def put(self, key: str, data: bytes, **kwargs: Any) -> None:
        self._write(
            lambda *a: self._store.put(*a, **kwargs),
            (key, data),
            lambda mine: (self.uploaded if mine else self._others.setdefault(threading.get_ident(), [])).append(key),
        )

    def put_manifest(self, data: bytes, **kwargs: Any) -> None:
        def announced(mine: bool) -> None:
            if mine:
                self.announced = True
            else:
                self._others.pop(threading.get_ident(), None)

        self._write(lambda *a: self._store.put_manifest(*a, **kwargs), (data,), announced)

    def unannounced(self) -> list[str]:
        """Every key uploaded and not announced: the version in hand's, and other threads'."""
        with self._cond:
            others = [k for keys in self._others.values() for k in keys]
            return (self.uploaded if not self.announced else []) + others

    def cancel(self) -> tuple[list[str], bool, list[str]]:
        """Refuse writes from now on; once the writes in flight are done, return the keys
        the version in hand uploaded, whether it was announced, and the keys other threads
        uploaded without announcing them."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()  # a write waiting to try again gives up
            self._cond.wait_for(lambda: self._in_flight == 0)
            return (list(self.uploaded), self.announced, [k for keys in self._others.values() for k in keys])

    def _write(self, op: Callable[..., None], args: tuple, record: Callable[[bool], None]) -> None:
        with self._cond:
            if self._cancelled:
                raise PublishCancelled("the publisher was cancelled before this write")
            self._in_flight += 1
        try:
            self._retrying(op, args)
            with self._cond:
                record(threading.get_ident() == self._worker)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def _retrying(self, op: Callable[..., None], args: tuple) -> None:
        retry = self._store.config.retry
        t0, delay, tries = time.monotonic(), retry.backoff_s, 0
        while True:
            tries += 1
            try:
                return op(*args)
            except TransportError as exc:
                waited = time.monotonic() - t0
                if waited + delay > self.retry_for_s:
                    if tries == 1:
                        raise
                    raise TransportError(
                        f"{exc} ({tries} tries in {waited:.1f} s: PublisherConfig.retry_for_s)"
                    ) from exc
                if tries == 1:
                    log.warning(
                        "%s",
                        kv("store_write_failed", error=str(exc), next=f"trying again for up to {self.retry_for_s:g} s"),
                    )
            with self._cond:
                if self._cond.wait_for(lambda: self._cancelled, delay):
                    raise PublishCancelled("the publisher was cancelled while a write waited to be tried again")
            delay = min(delay * 2, retry.backoff_max_s)


def describe_cancel(
    dropped: list[int],
    current: int | None,
    uploaded: list[str],
    announced: bool,
    stray: list[str],
    published: int | None = None,
) -> str:
    """What a cancel left, in words: the newest version published (`published`, unless the
    version in hand, `current`, was announced after all), the versions not published and
    any object uploaded but not announced."""
    parts = []
    if current is not None and announced:
        parts.append(f"version {current} was published just before")
    elif published is not None:
        parts.append(f"version {published} was published")
    if current is not None and not announced:
        if uploaded:
            parts.append(
                f"version {current} was not published: {', '.join(uploaded)} "
                f"uploaded but not in the manifest (unused; safe to delete)"
            )
        else:
            parts.append(f"version {current} was not published (stopped before its upload; nothing was written)")
    if stray:
        parts.append(
            f"an anchor upload was stopped: {', '.join(stray)} uploaded but not in "
            f"the manifest (unused; safe to delete)"
        )
    if dropped:
        parts.append(f"queued version(s) {', '.join(map(str, dropped))} not published")
    return "; ".join(parts) or "nothing was published"
