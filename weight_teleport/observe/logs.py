"""Structured logs: one line per event, `event=NAME key=value ...`.

Values with spaces, quotes or `=` are quoted; floats keep 4 significant digits. Expected
conditions are logged as events without tracebacks; `Repeats` keeps a condition that
persists (a store that is down) to one line per backoff step."""

from __future__ import annotations

import logging
import re
import time

_BARE = re.compile(r"[^\s\"=]+\Z")
FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def _value(v: object) -> str:
    if isinstance(v, float):
        text = f"{v:.4g}"
    else:
        text = str(v)
    if text and _BARE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def kv(event: str, **fields: object) -> str:
    """`event=EVENT k=v ...` for the fields that are not None."""
    parts = [f"event={event}"]
    parts += [f"{k}={_value(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


def configure(level: str = "warning") -> None:
    """Log to stderr in the key=value form (the CLI's entry points call this)."""
    logging.basicConfig(level=level.upper(), format=FORMAT)


class Repeats:
    """Tells whether a recurring condition is worth a log line: the first time, then once
    each time its count reaches the next power of two (one line per backoff step of a
    doubling backoff), and again after `quiet_s` of silence."""

    def __init__(self, quiet_s: float = 300.0):
        self.quiet_s = quiet_s
        self._count = 0
        self._last = 0.0

    def should_log(self) -> bool:
        self._count += 1
        now = time.monotonic()
        due = (self._count & (self._count - 1)) == 0 or now - self._last >= self.quiet_s
        if due:
            self._last = now
        return due

    @property
    def count(self) -> int:
        """Occurrences since the last `reset`."""
        return self._count

    def reset(self) -> int:
        """The condition ended; returns how often it occurred."""
        n, self._count = self._count, 0
        return n
