"""The symbol streams of a pack's sparse chunks, decoded into one device buffer.

The stored bytes are uploaded once and gathered into SLOT_ALIGN-aligned slots on the GPU;
zstd streams are decoded there by nvCOMP (one batched call per size bucket, no host
synchronisation: its statuses and decoded sizes are checked with the caller's one sync).
Without nvCOMP the CPU's zstd decodes them into a host buffer that is uploaded."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda import entropy, layout
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.gather import gather_rows
from weight_teleport.codec.cuda.tables import StreamTable
from weight_teleport.errors import PackFormatError

A = entropy.SLOT_ALIGN
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


def _slots(lengths: np.ndarray) -> tuple[np.ndarray, int]:
    slot = -(-lengths // A) * A
    return layout.starts(slot), int(slot.sum())


_pack_ring, _pack_lock = layout.PinnedRing(), threading.Lock()
"""The pinned buffer every upload of pack bytes passes through (grown, never shrunk), filled
by threads."""


def _upload(pack, lo: int, hi: int, device) -> torch.Tensor:
    size = memoryview(pack).nbytes
    if hi > size:
        raise PackFormatError(f"pack truncated: its chunks end at byte {hi}, the pack has {size}")
    parts = [memoryview(pack)[lo:hi]] if hi > lo else [b"\0"]
    if torch.device(device).type != "cuda":
        return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8).to(device)
    out = torch.empty(max(hi - lo, 1), dtype=torch.uint8, device=device)
    with _pack_lock:
        _pack_ring.send(parts, out)
    return out


class Upload:
    """Bytes [lo, hi) of a pack copied to the device on a host thread and a stream of their
    own (through the pinned buffer, filled by threads): the caller reads the stream tables
    meanwhile and its kernels that need no byte of the pack run beside the copy."""

    def __init__(self, pack, lo: int, hi: int, device, pool: ThreadPoolExecutor):
        self.lo = lo
        self._bytes = pool.submit(self._copy, pack, lo, hi, device, torch.cuda.Stream(device))

    @staticmethod
    def _copy(pack, lo: int, hi: int, device, stream) -> tuple[torch.Tensor, torch.cuda.Event]:
        with torch.cuda.stream(stream):
            out = _upload(pack, lo, hi, device)
            done = torch.cuda.Event()
            done.record(stream)
        return out, done

    def bytes(self) -> torch.Tensor:
        """The bytes on the device; the caller's current stream waits for their copy."""
        out, done = self._bytes.result()
        current = torch.cuda.current_stream(out.device)
        current.wait_event(done)
        out.record_stream(current)
        return out


def _check(codec: np.ndarray, raw: np.ndarray, stored: np.ndarray) -> None:
    if not np.isin(codec, (codecs.RAW, codecs.ZSTD)).all():
        bad = int(codec[~np.isin(codec, (codecs.RAW, codecs.ZSTD))][0])
        codecs.decode_stream(bad, b"", 0)
    if ((codec == codecs.RAW) & (raw != stored)).any():
        raise PackFormatError("raw stream holds another number of bytes than its table says")
    if ((codec == codecs.ZSTD) & ((raw == 0) | (stored == 0))).any():
        raise PackFormatError("empty zstd stream")


@njit(nogil=True, cache=True)
def _plan(codec, raw, stored, at, lo):
    """The device buffer's layout in one walk over the streams: (the raw streams' slots, the
    bytes of those slots, then of the stored zstd streams' slots that follow them, the
    copies of stored bytes into the buffer as [n, 3] rows (pack offset - lo, buffer offset,
    length), the zstd streams' indices, their stored bytes' offsets in the buffer). The raw
    slots' bytes are -1 for streams _check refuses."""
    n = codec.size
    out_off = np.empty(n, np.int64)
    out_total, n_zstd, n_copy = 0, 0, 0
    for i in range(n):
        c = codec[i]
        if not ((c == RAW and raw[i] == stored[i]) or (c == ZSTD and raw[i] > 0 and stored[i] > 0)):
            return out_off, -1, 0, np.empty((0, 3), np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        out_off[i] = out_total
        out_total += -(-raw[i] // A) * A
        n_zstd += c == ZSTD
        n_copy += stored[i] > 0
    copies = np.empty((n_copy, 3), np.int64)
    zstd, comp_off = np.empty(n_zstd, np.int64), np.empty(n_zstd, np.int64)
    k, z, comp_total = 0, 0, 0
    for i in range(n):
        if stored[i] == 0:
            continue
        dst = out_off[i]
        if codec[i] == ZSTD:
            dst = out_total + comp_total
            comp_total += -(-stored[i] // A) * A
            zstd[z], comp_off[z] = i, dst
            z += 1
        copies[k, 0], copies[k, 1], copies[k, 2] = at[i] - lo, dst, stored[i]
        k += 1
    return out_off, out_total, comp_total, copies, zstd, comp_off


def _on_gpu(pack, codec, raw, stored, at, device, upload) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    lo, hi = (int(at.min()), int((at + stored).max())) if at.size else (0, 0)
    lo = upload.lo if upload else lo
    out_off, out_total, comp_total, copies, zs, comp_off = _plan(codec, raw, stored, at, lo)
    if out_total < 0:
        _check(codec, raw, stored)  # raises the error that names what is wrong
    buf = torch.zeros(out_total + comp_total + PAD, dtype=torch.uint8, device=device)
    src = upload.bytes() if upload else _upload(pack, lo, hi, device)
    gather_rows(src, buf, copies)
    if not zs.size:
        return buf, out_off, torch.zeros((), dtype=torch.bool, device=device)
    pend = entropy.decompress(CudaCodecConfig(), buf, comp_off, stored[zs], buf, out_off[zs], raw[zs])
    sizes, statuses = pend.host()
    expect = layout.upload(raw[zs][pend.order], device)
    return buf, out_off, (statuses != 0).any() | (sizes != expect).any()


def _on_cpu(pack, codec, raw, stored, at, device, threads) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    out_off, out_total = _slots(raw)
    host = np.zeros(out_total + PAD, np.uint8)
    view = memoryview(pack)

    def one(i: int) -> None:
        data = view[at[i]:at[i] + stored[i]]
        host[out_off[i]:out_off[i] + raw[i]] = codecs.decode_stream(int(codec[i]), data, int(raw[i]))

    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        list(pool.map(one, np.flatnonzero(raw)))
    return torch.from_numpy(host).to(device), out_off, torch.zeros((), dtype=torch.bool, device=device)


def inflate(pack, table: StreamTable, device, threads: int | None = None, upload: Upload | None = None) -> Inflated:
    """Every stream of `table` decoded into one device buffer (nvCOMP when installed).
    `upload`, started earlier, holds the streams' bytes on the device; without it they are
    uploaded here."""
    codec, raw, stored, at = (a.ravel() for a in (table.codec, table.raw, table.stored, table.at))
    if entropy.available():
        buf, off, failed = _on_gpu(pack, codec, raw, stored, at, device, upload)
    else:
        _check(codec, raw, stored)
        buf, off, failed = _on_cpu(pack, codec, raw, stored, at, device, threads)
    return Inflated(buf, off.reshape(table.raw.shape), failed)
