"""Host memory and the process around the codec's calls: the garbage collector paused
while a call's short-lived containers live, and copies into fresh memory by threads (with
huge-page advice where Linux takes it). Used by the pack writer (format/container.py), the
codec's calls (codec/api.py) and the CUDA backend's host staging (codec/cuda/runtime)."""

import ctypes
import gc
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

THREADED_FILL_FROM = 16 << 20
"""`fill` copies at least this many bytes with threads, and packs this large are joined by it:
below it, starting threads costs more than they save. Filling fresh memory is bound by its
first-touch page faults, which threads take in parallel."""
FILL_THREADS = 8
"""Threads `fill` uses by default."""

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20


_paused = {"depth": 0, "resume": False}
_paused_lock = threading.Lock()


@contextmanager
def collections_paused():
    """The garbage collector paused, if it runs, while a burst of short-lived containers
    lives: the codec's calls (codec/api.py) and the header's JSON. Objects that die inside
    the pause are freed by reference counting and never promoted; promoted ones, even when
    freed soon after, count towards CPython's next full collection of the whole process
    (torch, numba and triton loaded: a call holding one takes several times its median).
    A header of thousands of chunks is tens of thousands of JSON lists, and an encode or
    stage call makes as many containers again, so both are paused (bench/investigations/header_gc.py and
    bench/investigations/call_gc.py count the collections a call holds, paused and not).
    Reentrant and thread-safe: the collector runs again when the last pause ends, if it ran
    before the first."""
    with _paused_lock:
        if _paused["depth"] == 0:
            _paused["resume"] = gc.isenabled()
            gc.disable()
        _paused["depth"] += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused["depth"] -= 1
            if _paused["depth"] == 0 and _paused["resume"]:
                gc.enable()


def join(parts: list) -> bytes:
    """b"".join(parts). A large result is a new bytes object (CPython's
    PyBytes_FromStringAndSize(NULL, n)) that threads fill, each a span of it, before it is
    returned: nothing else holds it while it is written."""
    n = sum(memoryview(p).nbytes for p in parts)
    if n == 0 or n < THREADED_FILL_FROM:
        return b"".join(parts)
    out = _new_bytes(None, n)
    addr = ctypes.cast(ctypes.c_char_p(out), ctypes.c_void_p).value
    assert addr is not None  # a bytes object's data, never NULL
    _advise_huge_pages(addr, n)
    fill(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr)), parts)
    return out


def _advise_huge_pages(addr: int, n: int) -> None:
    """Ask Linux to back the whole 2 MB pages of [addr, addr + n) with huge pages (where
    transparent huge pages are on "madvise"; a no-op elsewhere). Filling fresh memory is bound
    by its page faults, 512 times fewer with huge pages."""
    lo, hi = -(-addr // HUGE_PAGE) * HUGE_PAGE, (addr + n) // HUGE_PAGE * HUGE_PAGE
    if _libc is not None and hi > lo:
        _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_HUGEPAGE)  # advice: failure changes nothing


def in_runs(n: int, work, threads: int) -> list:
    """[work(lo, hi)] for up to `threads` even runs [lo, hi) that cut range(n), on threads
    when there are several (for work that releases the GIL: numpy copies, zlib, compiled
    walks), else on the calling thread."""
    cuts = np.linspace(0, n, max(1, min(threads, n)) + 1).astype(np.int64)
    runs = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]
    if len(runs) == 1:
        return [work(*runs[0])]
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        return list(pool.map(lambda r: work(*r), runs))


def fill(dst: np.ndarray, parts: list, threads: int = FILL_THREADS) -> None:
    """dst[:] = the bytes of `parts` end to end, copied by up to `threads` threads from
    THREADED_FILL_FROM bytes, each a span of `dst` (fresh pages fault in parallel). One
    smaller part is one copy, with none of the spans' bookkeeping (a host table on its way to
    the device)."""
    if len(parts) == 1 and memoryview(parts[0]).nbytes < THREADED_FILL_FROM:
        src = np.frombuffer(parts[0], np.uint8)
        assert dst.dtype == np.uint8 and dst.size == src.size
        dst[:] = src
        return
    sizes = np.array([memoryview(p).nbytes for p in parts], np.int64)
    n = int(sizes.sum())
    assert dst.dtype == np.uint8 and dst.size == n
    starts = np.cumsum(sizes) - sizes

    def span(lo: int, hi: int) -> None:
        for i in range(np.searchsorted(starts, lo, "right") - 1, len(parts)):
            if starts[i] >= hi:
                break
            a, b = max(lo, starts[i]), min(hi, starts[i] + sizes[i])
            if b > a:
                dst[a:b] = np.frombuffer(parts[i], np.uint8)[a - starts[i] : b - starts[i]]

    in_runs(n, span, min(threads, os.cpu_count() or 1) if n >= THREADED_FILL_FROM else 1)
