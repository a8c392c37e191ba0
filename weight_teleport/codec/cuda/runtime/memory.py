"""Layout checks every kernel wrapper runs before a launch, where runs of items start, and
the upload of host tables."""

import functools
import threading

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.host_memory import FILL_THREADS, fill


def on_device(tensor: torch.Tensor) -> bool:
    """Whether the kernels can read `tensor` where it is."""
    return tensor.is_cuda


def require(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`tensor` itself, after asserting it is a flat contiguous device array of `dtype`."""
    assert on_device(tensor), f"kernel input on {tensor.device}, expected a CUDA device"
    assert tensor.dim() == 1 and tensor.is_contiguous(), "kernel input must be flat and contiguous"
    assert dtype is None or tensor.dtype == dtype, f"kernel input is {tensor.dtype}, expected {dtype}"
    return tensor


@functools.cache
def side_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """The stream of `device` that work of one `role` runs on beside the current stream,
    the same one every call: its memory stays in one pool of torch's caching allocator
    (a stream per call draws from torch's pool of streams, each with its own cached
    blocks). Default priority: a stage runs while the sampler generates, and a higher one
    would put the stage's kernels ahead of the sampler's."""
    return torch.cuda.Stream(device)


def starts(counts, axis: int = 0):
    """Where each of consecutive runs of `counts` items starts: the exclusive prefix sum
    along `axis` (a numpy array or a torch tensor, as given)."""
    return counts.cumsum(axis) - counts


def items(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(run, index within its run) of every item of consecutive runs of `counts` items."""
    run = np.repeat(np.arange(counts.size), counts)
    return run, np.arange(run.size) - starts(counts)[run]


def pinned(buf) -> torch.Tensor | None:
    """`buf`'s bytes as a uint8 tensor when they lie in pinned (page-locked) host memory, such
    as a pack fetched into `pinned_empty`'s memory: the device copies them from there, with no
    host copy first. None otherwise (`bytes` are never pinned)."""
    view = memoryview(buf)
    if view.readonly or not view.contiguous or not torch.cuda.is_available():
        return None
    host = torch.from_numpy(np.frombuffer(view, np.uint8))
    return host if host.is_pinned() else None


def pinned_empty(n: int) -> np.ndarray:
    """n bytes of pinned host memory (torch's caching allocator: freed, they are reused), as
    a writable uint8 array."""
    return torch.empty(n, dtype=torch.uint8, pin_memory=True).numpy()


def pinned_copy(data) -> np.ndarray:
    """The bytes of `data` in pinned host memory (`pinned_empty`), copied by threads."""
    out = pinned_empty(memoryview(data).nbytes)
    fill(out, [data])
    return out


class PinnedRing:
    """A pinned host buffer that host bytes pass through on their way to the device (pinning
    memory for each transfer costs more than copying into it; a copy from pageable memory
    would stall the host behind every kernel launched before it), filled from the front.
    Full, it starts over once every copy out of it is done, else it is replaced by a larger
    one (torch's pinned allocator keeps the old one until its copies end). A call rewinds it
    first (`rewind`), so it grows only while one call's bytes exceed it: a buffer full in
    the middle of a call has copies still queued behind that call's kernels, and pinning a
    larger one then stalls the call. One user at a time."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.used = 0
        self.copies: list[torch.cuda.Event] = []

    def _take(self, n: int) -> torch.Tensor:
        at = -(-self.used // 64) * 64
        if at + n > self.buffer.numel():
            if n > self.buffer.numel() or not all(done.query() for done in self.copies):
                self.buffer = torch.empty(max(n, 2 * self.buffer.numel(), 4 << 20), dtype=torch.uint8, pin_memory=True)
            self.copies.clear()
            at = 0
        self.used = at + n
        return self.buffer[at : at + n]

    def rewind(self) -> None:
        """Start over from the front when every copy out of the buffer is done."""
        if all(done.query() for done in self.copies):
            self.used = 0
            self.copies.clear()

    def send(self, parts: list, out: torch.Tensor, threads: int = FILL_THREADS) -> None:
        """The bytes of `parts`, end to end, into the device tensor `out` (as many bytes), on
        its device's current stream, copied into the buffer by up to `threads` threads; the
        host does not wait."""
        host = self._take(out.numel() * out.element_size())
        fill(host.numpy(), parts, threads)
        out.view(-1).view(torch.uint8).copy_(host, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(out.device))
        self.copies.append(done)


class HostArena:
    """Host memory for a call's temporary tables, reused from call to call: a fresh numpy
    array of a few MB is fresh pages, and faulting them in costs more than filling them.
    Arrays are taken from the front; they stay valid until
    the arena is rewound (at the start of the thread's next call). Full, it is replaced by
    one as large as the call has taken so far (arrays already taken keep the old one
    alive); at the rewind, a buffer smaller than the whole call took is replaced by one that
    large, so the next call that takes as much fits (sized only by what the full buffer
    held, it would grow by about a table a call, and be replaced in every call)."""

    def __init__(self):
        self.buffer = np.empty(0, np.uint8)
        self.used = 0
        self.taken = 0
        """Bytes taken since the last rewind, alignment included."""

    def empty(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        at = -(-self.used // 64) * 64
        self.taken += -(-n // 64) * 64
        if at + n > self.buffer.size:
            self.buffer = np.empty(max(self.taken, 1 << 20), np.uint8)
            at = 0
        self.used = at + n
        return self.buffer[at : at + n].view(dtype).reshape(shape)

    def zeros(self, shape, dtype) -> np.ndarray:
        out = self.empty(shape, dtype)
        out.fill(0)
        return out

    def rewind(self) -> None:
        if self.taken > self.buffer.size:
            self.buffer = np.empty(self.taken, np.uint8)
        self.used = self.taken = 0


class _PerThread(threading.local):
    def __init__(self):
        self.ring = PinnedRing()
        self.arena = HostArena()


_tables = _PerThread()
"""Each thread's ring for small host tables, and its arena of temporary host tables."""


def begin_call() -> None:
    """Start an encode or stage call: this thread's table ring starts over if it can, and
    its host arena starts over (the previous call's temporary tables are done with)."""
    _tables.ring.rewind()
    _tables.arena.rewind()


def arena() -> HostArena:
    """This thread's arena of temporary host tables (valid until its next call begins)."""
    return _tables.arena


def upload(array: np.ndarray, dev) -> torch.Tensor:
    """A host array on device `dev`, in its dtype and shape, through this thread's pinned
    ring; the host does not wait for the copy."""
    a = np.ascontiguousarray(array)
    if torch.device(dev).type != "cuda":  # a copy: `array` may be a temporary of the arena
        return torch.from_numpy(a).to(dev, copy=True)
    out = torch.empty(a.shape, dtype=torch.from_numpy(a[:0].reshape(-1)).dtype, device=dev)
    _tables.ring.send([a.reshape(-1).view(np.uint8)], out)
    return out


def to_device(arrays: list[np.ndarray], dev) -> list[torch.Tensor]:
    """Host integer arrays as device int64 tensors of their shapes, in one upload (put end
    to end in the thread's arena)."""
    sizes = [int(np.size(a)) for a in arrays]
    flat = arena().empty(sum(sizes), np.int64)
    at = 0
    for a, n in zip(arrays, sizes):
        flat[at : at + n] = np.ravel(a)
        at += n
    on_dev = upload(flat, dev)
    out, at = [], 0
    for a, n in zip(arrays, sizes):
        out.append(on_dev[at : at + n].view(np.shape(a)))
        at += n
    return out


@triton.jit
def _store_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n), mask=i < n)


def to_pinned(t: torch.Tensor) -> tuple[np.ndarray, torch.cuda.Event | None]:
    """A small contiguous device tensor on its way to pinned host memory, queued now on the
    current stream; and the event to wait for before reading it (None: on the host
    already). A kernel's stores write it (the device reaches pinned memory at the same
    address), not a copy engine: a copy on another stream would wait behind the payload's
    copy to the host on the copy engine."""
    if not t.is_cuda:
        return t.numpy(), None
    assert t.is_contiguous()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    if t.numel():
        _store_kernel[(triton.cdiv(t.numel(), 1024),)](t, host, t.numel(), BLOCK=1024)
    done = torch.cuda.Event()
    done.record()
    return host.numpy(), done


def wait(done: torch.cuda.Event | None) -> None:
    """Wait for `done` (None: nothing to wait for)."""
    if done is not None:
        done.synchronize()
