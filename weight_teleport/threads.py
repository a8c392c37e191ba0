"""Background threads that end before the interpreter does.

CPython before 3.14 ends a daemon thread that takes the GIL back once interpreter
finalization has begun with pthread_exit. Its unwinding runs into a noexcept C++ frame on
the way out of any torch call (pybind11's `gil_scoped_release` destructor) and the process
aborts: "terminate called without an active exception", exit status 134. So a thread of
ours that may be inside torch, numba or other native code is started with `start`: at exit
(atexit handlers run before finalization begins, while daemon threads still run) every
one still alive is asked to stop, then joined. A stop must make its thread end after the
native call in hand; the exit waits for that call, never for new work.

The threads stay daemon threads so that an owner nobody closed does not keep a process
alive: the interpreter does not join daemon threads, this module does, after their stop.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_lock = threading.Lock()
_live: dict[threading.Thread, Callable[[], None]] = {}
"""Every thread started here and not ended yet -> the function that stops it."""


def _forked() -> None:
    """A forked child has none of these threads, and the lock may have been held by one."""
    global _lock
    _lock = threading.Lock()
    _live.clear()


os.register_at_fork(after_in_child=_forked)


def start(target: Callable[[], None], name: str, stop: Callable[[], None]) -> threading.Thread:
    """Run `target` on a daemon thread named `name`; if it is still running when the
    interpreter exits, `stop()` is called (from the main thread), then the thread joined."""

    def run() -> None:
        try:
            target()
        finally:
            with _lock:
                _live.pop(thread, None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _lock:
        _live[thread] = stop
    thread.start()
    return thread


@atexit.register
def stop_all() -> None:
    """Stop every live thread started here and wait until each has ended."""
    with _lock:
        live = list(_live.items())
    for thread, stop in live:
        try:
            stop()
        except Exception:  # the join below still waits: an exit must not abort
            log.exception("stopping %s at exit failed", thread.name)
    for thread, _ in live:
        if thread is not threading.current_thread():
            thread.join()
