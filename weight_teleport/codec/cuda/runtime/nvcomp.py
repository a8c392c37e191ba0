"""Batched stream coding with nvCOMP's C API (the `nvidia-libnvcomp-cu13` wheel), over tables
of device pointers: one call per size bucket for thousands of streams, no host copies.

Streams are grouped by size in powers of four, because nvCOMP sizes every output slot and
its scratch by the largest input of a call."""

import ctypes
import importlib.util
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from numba import njit

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.config import CudaCodecConfig

_NAMES = {"zstd": "Zstd", "lz4": "LZ4", "ans": "ANS"}
_BACKEND = {"default": 0, "hardware": 1, "cuda": 2}
SLOT_ALIGN = 16
"""Alignment of every stream slot the backend lays out (nvCOMP needs at most 8)."""
P, S = ctypes.c_void_p, ctypes.c_size_t


class _Opts(ctypes.Structure):
    """Any nvCOMP batched options struct: two 32-bit fields, then reserved zero bytes."""

    _fields_ = [("a", ctypes.c_int32), ("b", ctypes.c_int32), ("rest", ctypes.c_char * 56)]


@lru_cache(None)
def library() -> ctypes.CDLL | None:
    """The nvCOMP shared library, or None when the wheel is not installed."""
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("lib64/libnvcomp.so*"))
    return ctypes.CDLL(str(found[0])) if found else None


def available() -> bool:
    return library() is not None


def _fn(algorithm: str, suffix: str, argtypes):
    f = getattr(library(), f"nvcompBatched{_NAMES[algorithm]}{suffix}")
    f.argtypes, f.restype = argtypes, ctypes.c_int
    return f


def _call(f, *args) -> None:
    status = f(*args)
    if status != 0:
        raise RuntimeError(f"{f.__name__} failed with nvcompStatus {status}")


def _compress_opts() -> _Opts:
    return _Opts()


def _decompress_opts(cfg: CudaCodecConfig, algorithm: str) -> _Opts:
    return _Opts(_BACKEND[cfg.decompress_backend], 0xFF if algorithm == "ans" else 0)


MAX_BUCKETS = 33
"""Size buckets of streams below 2^64 bytes."""
CODED = (codecs.ZSTD, codecs.LZ4, codecs.NVCOMP_ANS)
"""The stream codecs nvCOMP decodes, as the groups of a decompression (`bucket_sort`)."""
CODEC_ID = {"zstd": codecs.ZSTD, "lz4": codecs.LZ4, "ans": codecs.NVCOMP_ANS}
"""The stream codec id of each nvCOMP algorithm (config.NVCOMP_ALGORITHM's values)."""
ALGORITHM = {i: a for a, i in CODEC_ID.items()}
"""The nvCOMP algorithm of each stream codec id nvCOMP decodes."""
N_KEYS = len(CODED) * MAX_BUCKETS
"""The keys (group, size bucket) streams are sorted by (`bucket_sort`)."""
_GROUP = np.full(max(CODED) + 1, -1, np.int64)
_GROUP[list(CODED)] = np.arange(len(CODED))


@njit(nogil=True, cache=True, inline="always")
def _bucket(n: int) -> int:
    """The size bucket of an n-byte stream: ceil(log4(n)), 0 for n <= 1."""
    b, x = 0, max(n, 1) - 1
    while x:
        b += 1
        x >>= 1
    return (b + 1) // 2


@njit(nogil=True, cache=True, inline="always")
def coded_group(codec: int) -> int:
    """A stream codec's index in CODED (-1: not one nvCOMP decodes)."""
    return _GROUP[codec] if 0 <= codec < _GROUP.size else -1


@njit(nogil=True, cache=True)
def bucket_sort(lengths, groups, order, cuts, keys) -> int:
    """Fills `order` with the streams sorted by (group, size bucket), stably (a counting
    sort; `groups` below len(CODED)), cuts[:n + 1] with the bounds of the n keys that hold
    streams and keys[:n] with those keys (group * MAX_BUCKETS + bucket); returns n."""
    count = np.zeros(N_KEYS + 1, np.int64)
    for j in range(lengths.size):
        count[groups[j] * MAX_BUCKETS + _bucket(lengths[j]) + 1] += 1
    at = np.cumsum(count)
    for j in range(lengths.size):
        key = groups[j] * MAX_BUCKETS + _bucket(lengths[j])
        order[at[key]] = j
        at[key] += 1
    n, cuts[0] = 0, 0
    for key in range(N_KEYS):
        if count[key + 1]:
            cuts[n + 1] = cuts[n] + count[key + 1]
            keys[n] = key
            n += 1
    return n


@njit(nogil=True, cache=True)
def plan_rows(order, offsets, stored, raw, dst_offsets, table) -> None:
    """table[:, p] = (offset, stored, raw, output offset) of stream order[p]."""
    for p in range(order.size):
        j = order[p]
        table[0, p], table[1, p], table[2, p], table[3, p] = offsets[j], stored[j], raw[j], dst_offsets[j]


def bucket_arrays(n: int) -> list[np.ndarray]:
    """`bucket_sort`'s order, cuts and keys for n streams."""
    return [np.empty(n, np.int64), np.empty(N_KEYS + 1, np.int64), np.empty(N_KEYS, np.int64)]


def bucket_ranges(cuts: np.ndarray, keys: np.ndarray, n: int) -> list[tuple[int, int, str]]:
    """(start, stop, algorithm) of each of `bucket_sort`'s n keys."""
    return [(int(cuts[i]), int(cuts[i + 1]), ALGORITHM[CODED[int(keys[i]) // MAX_BUCKETS]]) for i in range(n)]


def _buckets(lengths: np.ndarray, codec: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
    """(order of streams grouped by codec (`codec`; None: all zstd) and size bucket,
    (start, stop, algorithm) ranges of the order)."""
    groups = np.zeros(lengths.size, np.int64) if codec is None else _GROUP[codec]
    if (groups < 0).any():
        raise ValueError("a stream codec nvCOMP does not decode")
    order, cuts, keys = bucket_arrays(lengths.size)
    n = bucket_sort(lengths.astype(np.int64), groups, order, cuts, keys)
    return order, bucket_ranges(cuts, keys, n)


def _stream() -> ctypes.c_void_p:
    return P(torch.cuda.current_stream().cuda_stream)


@contextmanager
def _fanned(n: int):
    """Handles of `n` side streams that start after the current stream's queued work; the
    current stream waits for all of them on exit: nvCOMP's size buckets run side by side
    rather than one after another, so a bucket of small streams need not wait for a bucket
    of large ones."""
    main = torch.cuda.current_stream()
    sides = [memory.side_stream(main.device, f"nvcomp {i}") for i in range(n)]
    for side in sides:
        side.wait_stream(main)
    try:
        yield [P(side.cuda_stream) for side in sides]
    finally:
        for side in sides:
            main.wait_stream(side)


def _ptr_table(*cols: np.ndarray, device) -> torch.Tensor:
    table = memory.arena().empty((len(cols), cols[0].size), np.int64)
    for row, col in zip(table, cols):
        row[:] = col
    return memory.upload(table, device)


def _aligned(n: int, to: int = SLOT_ALIGN) -> int:
    return -(-n // to) * to


class Pending:
    """Sizes and statuses of an nvCOMP batch in flight, read back by `sizes()`."""

    def __init__(self, order: np.ndarray, sizes: torch.Tensor, statuses: torch.Tensor, keep):
        self.order, self._sizes, self._statuses, self._keep = order, sizes, statuses, keep

    def host(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Device tensors to fetch with the caller's single transfer: (sizes, statuses)."""
        return self._sizes, self._statuses

    def unpermute(self, values: np.ndarray) -> np.ndarray:
        """Per-stream values fetched from `host()`, back in the caller's stream order."""
        out = np.empty_like(values)
        out[self.order] = values
        return out


def compress(algorithm: str, src: torch.Tensor, offsets: np.ndarray, lengths: np.ndarray):
    """Compress the streams src[offsets[i]:offsets[i] + lengths[i]] (offsets SLOT_ALIGN-aligned)
    with nvCOMP's `algorithm` ('zstd', 'lz4', 'ans') into one new device buffer. Returns
    (buffer, host slot offsets, Pending); nothing syncs."""
    assert src.dtype == torch.uint8 and src.is_cuda and src.is_contiguous()
    assert (offsets % SLOT_ALIGN == 0).all() and src.data_ptr() % SLOT_ALIGN == 0
    order, buckets = _buckets(lengths)
    ranges = [(a, b) for a, b, _ in buckets]
    opts = _compress_opts()
    max_out = _fn(algorithm, "CompressGetMaxOutputChunkSize", [S, _Opts, ctypes.POINTER(S)])
    temp_size = _fn(algorithm, "CompressGetTempSize", [S, S, _Opts, ctypes.POINTER(S), S, P])
    slot = np.empty(lengths.size, np.int64)
    temp = 0
    for a, b in ranges:
        biggest = int(lengths[order[a:b]].max())
        out_n, t = S(), S()
        _call(max_out, biggest, opts, ctypes.byref(out_n))
        _call(temp_size, b - a, biggest, opts, ctypes.byref(t), int(lengths[order[a:b]].sum()), _stream())
        slot[order[a:b]] = _aligned(out_n.value)
        temp = max(temp, t.value)
    out_off = np.concatenate([[0], np.cumsum(slot)[:-1]]).astype(np.int64)
    out = torch.empty(int(slot.sum()), dtype=torch.uint8, device=src.device)
    table = _ptr_table(
        src.data_ptr() + offsets[order], out.data_ptr() + out_off[order], lengths[order], device=src.device
    )
    sizes = torch.empty(lengths.size, dtype=torch.int64, device=src.device)
    statuses = torch.empty(lengths.size, dtype=torch.int32, device=src.device)
    scratch = torch.empty(max(temp, 1), dtype=torch.uint8, device=src.device)
    run = _fn(algorithm, "CompressAsync", [P, P, S, S, P, S, P, P, _Opts, P, P])
    for a, b in ranges:
        biggest = int(lengths[order[a:b]].max())
        _call(
            run,
            table[0, a:].data_ptr(),
            table[2, a:].data_ptr(),
            biggest,
            b - a,
            scratch.data_ptr(),
            scratch.numel(),
            table[1, a:].data_ptr(),
            sizes[a:].data_ptr(),
            opts,
            statuses[a:].data_ptr(),
            _stream(),
        )
    return out, out_off, Pending(order, sizes, statuses, (table, scratch))


@dataclass
class DecompressPlan:
    """The host's part of a batched decompression (`plan_decompress`), made on any thread."""

    order: np.ndarray
    """The streams grouped by codec and size bucket."""
    ranges: list[tuple[int, int, str]]
    """(start, stop, nvCOMP algorithm) of each group in `order`."""
    temps: list[int]
    """Each group's scratch bytes (256-byte aligned)."""
    table: np.ndarray
    """[4, streams] (input offset, stored bytes, raw bytes, output offset) in `order`, the
    offsets from the start of the source and the destination buffers."""


def plan_decompress(
    cfg: CudaCodecConfig,
    offsets: np.ndarray,
    stored: np.ndarray,
    dst_offsets: np.ndarray,
    raw: np.ndarray,
    stream: int,
    codec: np.ndarray,
) -> DecompressPlan:
    """The plan of `decompress`ing streams at `offsets` (SLOT_ALIGN-aligned, `stored` bytes)
    of a source buffer into `dst_offsets` (aligned, `raw` bytes each) of a destination,
    each of stream codec `codec` (CODED's ids); nvCOMP's scratch sizes are queried for
    `stream` (a handle; nothing is queued on it)."""
    order, ranges = _buckets(raw, codec)
    table = memory.arena().empty((4, raw.size), np.int64)
    offsets, stored, raw, dst_offsets = (np.asarray(a, np.int64) for a in (offsets, stored, raw, dst_offsets))
    plan_rows(order, offsets, stored, raw, dst_offsets, table)
    return sized_plan(cfg, order, ranges, table, stream)


def sized_plan(
    cfg: CudaCodecConfig, order: np.ndarray, ranges: list[tuple[int, int, str]], table: np.ndarray, stream: int
) -> DecompressPlan:
    """The DecompressPlan of streams sorted into `ranges` of `order` with their `table`
    (`bucket_sort`, `plan_rows`), nvCOMP's scratch sized for each group; `cfg` gives the
    decompression backend."""
    assert (table[0] % SLOT_ALIGN == 0).all() and (table[3] % SLOT_ALIGN == 0).all()
    temps = []
    for a, b, algorithm in ranges:
        temp_size = _fn(algorithm, "DecompressGetTempSize", [S, S, _Opts, ctypes.POINTER(S), S, P])
        t = S()
        _call(
            temp_size,
            b - a,
            int(table[2, a:b].max()),
            _decompress_opts(cfg, algorithm),
            ctypes.byref(t),
            int(table[2, a:b].sum()),
            P(stream),
        )
        temps.append(_aligned(max(t.value, 1), 256))  # each group's own scratch, 256-byte aligned
    return DecompressPlan(order, ranges, temps, table)


def decompress(cfg: CudaCodecConfig, src: torch.Tensor, dst: torch.Tensor, plan: DecompressPlan) -> Pending:
    """Decompress the streams of `plan` from `src` into `dst` on the current stream. The
    Pending's sizes are the decoded lengths; the caller checks them and the statuses (0)
    after its one sync."""
    order, ranges, temps = plan.order, plan.ranges, plan.temps
    scratch_at = np.cumsum([0] + temps)
    rows = memory.arena().empty(plan.table.shape, np.int64)
    np.add(plan.table, np.array([[src.data_ptr()], [0], [0], [dst.data_ptr()]], np.int64), out=rows)
    table = memory.upload(rows, src.device)
    n = order.size
    sizes = torch.empty(n, dtype=torch.int64, device=src.device)
    statuses = torch.empty(n, dtype=torch.int32, device=src.device)
    scratch = torch.empty(max(int(scratch_at[-1]), 1), dtype=torch.uint8, device=src.device)
    with _fanned(len(ranges)) as streams:  # each group its own scratch
        for (a, b, algorithm), t, at, stream in zip(ranges, temps, scratch_at, streams):
            run = _fn(algorithm, "DecompressAsync", [P, P, P, P, S, P, S, P, _Opts, P, P])
            _call(
                run,
                table[0, a:].data_ptr(),
                table[1, a:].data_ptr(),
                table[2, a:].data_ptr(),
                sizes[a:].data_ptr(),
                b - a,
                scratch.data_ptr() + int(at),
                t,
                table[3, a:].data_ptr(),
                _decompress_opts(cfg, algorithm),
                statuses[a:].data_ptr(),
                stream,
            )
    return Pending(order, sizes, statuses, (table, scratch))
