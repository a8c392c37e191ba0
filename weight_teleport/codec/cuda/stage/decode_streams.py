"""The symbol streams of a pack's sparse chunks, decoded into one device buffer.

The stored bytes are uploaded once and gathered into SLOT_ALIGN-aligned slots on the GPU;
coded streams (zstd, and the GPU-only lz4 and nvcomp-ans) are decoded there by nvCOMP (one
batched call per codec and size bucket, no host synchronisation: its statuses and decoded
sizes are checked with the caller's one sync). Without nvCOMP the CPU's zstd decodes zstd
streams into a host buffer that is uploaded."""

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from numba import njit

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda.runtime import memory, nvcomp
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.kernels.gather import gather_rows
from weight_teleport.codec.cuda.kernels.stream_tables import StreamTable
from weight_teleport.errors import PackFormatError

A = nvcomp.SLOT_ALIGN
RAW, ZSTD = codecs.RAW, codecs.ZSTD
PAD = 2 * A
"""Zero bytes after the last slot: readers of a stream may load a few bytes past it."""


@dataclass
class Inflated:
    buffer: torch.Tensor
    """uint8 device buffer, every raw stream at its slot."""
    offsets: np.ndarray
    """[segments, 4] slot offsets of the raw streams."""
    failed: torch.Tensor
    """Device bool: some stream failed to decode or decoded to another length than its table's."""


_pack_ring, _pack_lock = memory.PinnedRing(), threading.Lock()
"""The pinned buffer every upload of pack bytes passes through (grown, never shrunk), filled
by threads."""
UPLOAD_THREADS = 4
"""Threads filling the pinned buffer with a stage call's pack. The copy runs beside the call's
main thread, and the fillers take the GIL between their copies: more threads fill the buffer
sooner alone but slow the main thread's launches more, and 4 gave shorter stage calls than
8 (bench/versions.py)."""


def upload_range(pack, lo: int, hi: int, device, pinned: torch.Tensor | None) -> torch.Tensor:
    """Bytes [lo, hi) of `pack` on `device`; `pinned` is `memory.pinned(pack)`, whose bytes
    are copied from where they are."""
    size = memoryview(pack).nbytes
    if hi > size:
        raise PackFormatError(f"pack truncated: its chunks end at byte {hi}, the pack has {size}")
    parts = [memoryview(pack)[lo:hi]] if hi > lo else [b"\0"]
    if torch.device(device).type != "cuda":
        return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8).to(device)
    out = torch.empty(max(hi - lo, 1), dtype=torch.uint8, device=device)
    if pinned is not None and hi > lo:  # a pack in pinned memory is copied from where it is
        out.copy_(pinned[lo:hi], non_blocking=True)
        return out
    with _pack_lock:
        _pack_ring.send(parts, out, UPLOAD_THREADS)
    return out


class Upload:
    """Bytes [lo, hi) of a pack copied to the device on a stream of their own: the caller
    reads the stream tables meanwhile and its kernels that need no byte of the pack run
    beside the copy. Bytes in pageable memory pass through the pinned buffer, filled by
    threads, on a host thread started at once. Bytes already in pinned memory need no host
    copy: their asynchronous copy is queued at `start` (or at `bytes`), so that the small
    tables the first kernels need are not queued behind it (copies to the device run one
    after the other)."""

    def __init__(self, pack, lo: int, hi: int, device, pool: ThreadPoolExecutor):
        self.lo, self.device = lo, torch.device(device)
        pinned = memory.pinned(pack)
        self._args = (pack, lo, hi, device, pinned, memory.side_stream(self.device, "upload"))
        self._bytes: Future | None = None
        if pinned is None:
            self._bytes = pool.submit(self._copy, *self._args)

    def start(self) -> None:
        """Queue the copy now if it has not started."""
        if self._bytes is None:
            self._bytes = Future()
            self._bytes.set_result(self._copy(*self._args))

    @staticmethod
    def _copy(pack, lo: int, hi: int, device, pinned, stream) -> tuple[torch.Tensor, torch.cuda.Event]:
        with torch.cuda.stream(stream):
            out = upload_range(pack, lo, hi, device, pinned)
            done = torch.cuda.Event()
            done.record(stream)
        return out, done

    def bytes(self) -> torch.Tensor:
        """The bytes on the device; the caller's current stream waits for their copy."""
        self.start()
        assert self._bytes is not None  # start() made it
        out, done = self._bytes.result()
        current = torch.cuda.current_stream(out.device)
        current.wait_event(done)
        out.record_stream(current)
        return out


class Layout(NamedTuple):
    """Where every stream goes in the device buffer (`_plan`)."""

    out_off: np.ndarray
    """Each raw stream's slot."""
    out_total: int
    """Bytes of the raw streams' slots."""
    comp_total: int
    """Bytes of the stored coded streams' slots, after the raw ones."""
    copies: np.ndarray
    """[n, 3] rows (pack offset - lo, buffer offset, length) of the stored bytes to copy."""
    coded: np.ndarray
    """Indices of the entropy-coded streams (zstd, lz4, nvcomp-ans: `nvcomp.CODED`)."""
    comp_off: np.ndarray
    """Their stored bytes' offsets in the buffer."""


@njit(nogil=True, cache=True)
def _plan(codec, raw, stored, at, lo, out_off, copies, coded, comp_off):
    """Fills a Layout's arrays (`out_off` and `coded` / `comp_off` / `copies` rows from the
    front; each as long as the streams) in one walk over the streams; returns (the first
    stream refused, out_total, comp_total, coded streams, copies). A raw stream must hold its
    raw length, a coded stream (of a codec nvCOMP decodes) must be non-empty both ways, no
    other codec is read."""
    n = codec.size
    out_total = 0
    for i in range(n):
        c = codec[i]
        if not ((c == RAW and raw[i] == stored[i]) or (nvcomp.coded_group(c) >= 0 and raw[i] > 0 and stored[i] > 0)):
            return i, 0, 0, 0, 0
        out_off[i] = out_total
        out_total += -(-raw[i] // A) * A
    k, z, comp_total = 0, 0, 0
    for i in range(n):
        if stored[i] == 0:
            continue
        dst = out_off[i]
        if codec[i] != RAW:
            dst = out_total + comp_total
            comp_total += -(-stored[i] // A) * A
            coded[z], comp_off[z] = i, dst
            z += 1
        copies[k, 0], copies[k, 1], copies[k, 2] = at[i] - lo, dst, stored[i]
        k += 1
    return -1, out_total, comp_total, z, k


def layout_arrays(n: int) -> tuple[np.ndarray, ...]:
    """The arrays `_plan` fills for `n` streams, in the thread's arena (`memory.arena`)."""
    arena = memory.arena()
    return arena.empty(n, np.int64), arena.empty((n, 3), np.int64), arena.empty(n, np.int64), arena.empty(n, np.int64)


def laid_out(pack, codec, raw, stored, at, arrays: tuple, planned: tuple) -> Layout:
    """The Layout in `arrays` that `_plan` returned `planned` for; a refused stream raises
    the error the CPU's decoder gives it."""
    bad, out_total, comp_total, z, k = planned
    if bad >= 0:
        c = int(codec[bad])
        if c in nvcomp.CODED and c != ZSTD:
            raise PackFormatError(f"{codecs.NAMES[c]} stream is empty ({raw[bad]} raw, {stored[bad]} stored bytes)")
        codecs.decode_stream(c, memoryview(pack)[at[bad] : at[bad] + stored[bad]], int(raw[bad]))
        raise PackFormatError("malformed stream")  # decode_stream refuses every other stream _plan does
    out_off, copies, coded, comp_off = arrays
    return Layout(out_off, out_total, comp_total, copies[:k], coded[:z], comp_off[:z])


def _layout(pack, codec, raw, stored, at, lo: int) -> Layout:
    """The streams' Layout (its arrays the calling thread's temporaries)."""
    arrays = layout_arrays(codec.size)
    return laid_out(pack, codec, raw, stored, at, arrays, _plan(codec, raw, stored, at, lo, *arrays))


class Prepared(NamedTuple):
    """The host's part of `inflate` (`prepare`, `planned`)."""

    layout: Layout
    lo: int
    """The first byte of the pack the upload holds."""
    hi: int | None
    """The end of the bytes to upload (None: an Upload has them)."""
    plan: nvcomp.DecompressPlan | None
    """nvCOMP's plan of the coded streams (None without nvCOMP or coded streams)."""
    cfg: CudaCodecConfig
    """The decompression's configuration (its backend)."""


def _on_gpu(pack, prep: Prepared, device, upload) -> tuple[torch.Tensor, torch.Tensor]:
    """(the device buffer, a device flag: a coded stream failed to decode or decoded to
    another length). The gather and nvCOMP's kernels need none of the caller's earlier
    work, so they run on a stream of their own, not queued behind the kernels launched
    before them (the stage's class counts), and the caller's stream waits for them."""
    if torch.device(device).type != "cuda":  # the Triton interpreter's tests
        return _decode_on(pack, prep, device, upload)
    main = torch.cuda.current_stream(device)
    side = stream(main.device)
    with torch.cuda.stream(side):
        buf, failed = _decode_on(pack, prep, device, upload)
    main.wait_stream(side)
    buf.record_stream(main)
    failed.record_stream(main)
    return buf, failed


def stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the decompression runs on (`_on_gpu`)."""
    return memory.side_stream(device, "inflate")


def _decode_on(pack, prep: Prepared, device, upload) -> tuple[torch.Tensor, torch.Tensor]:
    """`_on_gpu`'s work, on the current stream."""
    lay = prep.layout
    buf = torch.zeros(lay.out_total + lay.comp_total + PAD, dtype=torch.uint8, device=device)
    if upload:
        src = upload.bytes()
    else:
        assert prep.hi is not None  # None only where an Upload holds the bytes
        src = upload_range(pack, prep.lo, prep.hi, device, memory.pinned(pack))
    gather_rows(src, buf, lay.copies)
    if prep.plan is None:
        return buf, torch.zeros((), dtype=torch.bool, device=device)
    pend = nvcomp.decompress(prep.cfg, buf, buf, prep.plan)
    sizes, statuses = pend.host()
    expect = memory.upload(prep.plan.table[2], device)  # the raw lengths in the plan's order
    return buf, (statuses != 0).any() | (sizes != expect).any()


def _on_cpu(pack, lay: Layout, codec, raw, stored, at, device, threads) -> tuple[torch.Tensor, torch.Tensor]:
    host = np.zeros(lay.out_total + PAD, np.uint8)
    view = memoryview(pack)

    def one(i: int) -> None:
        data = view[at[i] : at[i] + stored[i]]
        host[lay.out_off[i] : lay.out_off[i] + raw[i]] = codecs.decode_stream(int(codec[i]), data, int(raw[i]))

    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        list(pool.map(one, np.flatnonzero(raw)))
    return torch.from_numpy(host).to(device), torch.zeros((), dtype=torch.bool, device=device)


def prepare(
    pack, table: StreamTable, device, upload: Upload | None = None, cfg: CudaCodecConfig | None = None
) -> Prepared:
    """The streams' layout in the device buffer and, with nvCOMP, the decompression's plan
    (`cfg`: its backend)."""
    codec, raw, stored, at = (a.ravel() for a in (table.codec, table.raw, table.stored, table.at))
    if upload:
        lo, hi = upload.lo, None  # the upload has the bytes
    else:
        lo, hi = (int(at.min()), int((at + stored).max())) if at.size else (0, 0)
    return planned(_layout(pack, codec, raw, stored, at, lo), lo, hi, codec, raw, stored, device, cfg)


def planned(
    lay: Layout,
    lo: int,
    hi: int | None,
    codec: np.ndarray,
    raw: np.ndarray,
    stored: np.ndarray,
    device,
    cfg: CudaCodecConfig | None = None,
    bucketed: tuple[np.ndarray, list[tuple[int, int, str]], np.ndarray] | None = None,
) -> Prepared:
    """`lay` (of streams of `codec`, `raw` and `stored` lengths) and, with nvCOMP, the plan of
    its coded streams' decompression with `cfg`'s backend; `bucketed`: their (order, ranges,
    table) made already (`nvcomp.bucket_sort`, `nvcomp.plan_rows`)."""
    cfg, plan = cfg or CudaCodecConfig(), None
    if nvcomp.available() and lay.coded.size:
        dev = torch.device(device)
        handle = stream(dev).cuda_stream if dev.type == "cuda" else 0
        cs = lay.coded
        plan = (
            nvcomp.sized_plan(cfg, *bucketed, handle)
            if bucketed
            else nvcomp.plan_decompress(cfg, lay.comp_off, stored[cs], lay.out_off[cs], raw[cs], handle, codec[cs])
        )
    return Prepared(lay, lo, hi, plan, cfg)


def inflate(
    pack,
    table: StreamTable,
    device,
    threads: int | None = None,
    upload: Upload | None = None,
    prep: Prepared | None = None,
) -> Inflated:
    """Every stream of `table` decoded into one device buffer (nvCOMP when installed).
    `upload`, started earlier, holds the streams' bytes on the device; without it they are
    uploaded here. `prep`: the layout and plan made already (`prepare`, or `planned` on a
    layout made elsewhere), else made here."""
    prep = prep or prepare(pack, table, device, upload)
    if nvcomp.available():
        buf, failed = _on_gpu(pack, prep, device, upload)
    else:
        codec, raw, stored, at = (a.ravel() for a in (table.codec, table.raw, table.stored, table.at))
        buf, failed = _on_cpu(pack, prep.layout, codec, raw, stored, at, device, threads)
    return Inflated(buf, prep.layout.out_off.reshape(table.raw.shape), failed)
