"""Sparse chunks from the GPU's symbol streams: stream coding (nvCOMP on the GPU, or the
CPU's zstd), then the payload of all chunks of a batch: chunk tables written by a compiled walk,
stored streams and tables gathered on the GPU, the CRC-32 of every chunk there too, one
copy to the host."""

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda import entropy, huffman, layout, symbols, tables
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.crc import crc32
from weight_teleport.codec.cuda.gather import gather

MIN_CODED = 16
"""Streams shorter than this are stored raw (as the CPU backend does)."""
CODEC_ID = {"zstd": codecs.ZSTD, "lz4": codecs.LZ4, "ans": codecs.NVCOMP_ANS}


@dataclass
class Coded:
    """Every stream's stored form, [segments, 4] like the symbol streams' lengths."""
    raw: torch.Tensor
    """The symbol streams' device buffer: the bytes of the streams stored raw."""
    coded: torch.Tensor
    """Device bytes of the coded streams."""
    src_off: np.ndarray
    """Where each stored stream starts: in `raw` for a raw stream, else in `coded`."""
    codec: np.ndarray
    """Stream codec ids."""
    stored: np.ndarray
    """Stored lengths."""


def _raw(st: symbols.SymbolStreams) -> Coded:
    return Coded(st.buffer, st.buffer[:0], st.offsets.copy(), np.full(st.lengths.shape, codecs.RAW, np.int64),
                 st.lengths.copy())


def _use(c: Coded, which: np.ndarray, codec, stored: np.ndarray, src_off: np.ndarray, coded: torch.Tensor) -> Coded:
    """`c` with the flat streams `which` stored as `codec` at `src_off` of `coded`."""
    for arr, v in ((c.codec, codec), (c.stored, stored), (c.src_off, src_off)):
        arr.reshape(-1)[which] = v
    c.coded = coded.to(c.raw.device)
    return c


def _code_nvcomp(cfg: CudaCodecConfig, st: symbols.SymbolStreams, todo: np.ndarray) -> Coded:
    off, ln = st.offsets.ravel()[todo], st.lengths.ravel()[todo]
    out, out_off, pending = entropy.compress(cfg, st.buffer, off, ln)
    sizes, statuses = pending.host()
    host = torch.cat([sizes, statuses.long()]).cpu().numpy()
    sizes, statuses = pending.unpermute(host[:ln.size]), pending.unpermute(host[ln.size:])
    if (statuses != 0).any():
        raise RuntimeError(f"nvCOMP {cfg.algorithm} failed on {int((statuses != 0).sum())} streams")
    smaller = sizes < ln
    return _use(_raw(st), todo[smaller], CODEC_ID[cfg.algorithm], sizes[smaller], out_off[smaller], out)


def _code_cpu(level: int, st: symbols.SymbolStreams, todo: np.ndarray, threads: int) -> Coded:
    raw_host = st.buffer.cpu().numpy()
    off, ln = st.offsets.ravel()[todo], st.lengths.ravel()[todo]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        out = list(pool.map(lambda a: codecs.encode_stream(raw_host[a[0]:a[0] + a[1]], level), zip(off, ln)))
    smaller = np.array([cid == codecs.ZSTD for cid, _ in out], bool)
    data = [d for (cid, d), s in zip(out, smaller) if s]
    sizes = np.array([len(d) for d in data], np.int64)
    blob = torch.frombuffer(bytearray(b"".join(data)), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    return _use(_raw(st), todo[smaller], codecs.ZSTD, sizes, layout.starts(sizes), blob)


def _code_huffman(st: symbols.SymbolStreams, todo: np.ndarray) -> Coded:
    """Huffman-literal zstd frames written on the GPU (codec/cuda/huffman.py)."""
    off, ln = st.offsets.ravel()[todo], st.lengths.ravel()[todo]
    p = huffman.plan(st.buffer, off, ln)
    info = p.info.cpu().numpy()
    sizes = huffman.frame_sizes(p, info)
    take = sizes < ln
    out, out_off = huffman.write(st.buffer, p, info, take, sizes)
    return _use(_raw(st), todo[take], codecs.ZSTD, sizes[take], out_off, out)


def code(st: symbols.SymbolStreams, cfg: CudaCodecConfig, level: int, threads: int) -> Coded:
    """The stored form of every stream: Huffman-literal frames (GPU), nvCOMP or the CPU's
    zstd where that is smaller, raw otherwise and for streams shorter than MIN_CODED."""
    todo = np.flatnonzero(st.lengths.ravel() >= MIN_CODED)
    if not cfg.portable and not entropy.available():
        raise RuntimeError(f"stream codec {cfg.algorithm!r} needs nvCOMP: pip install 'weight-teleport[cuda]'")
    if not todo.size:
        return _raw(st)
    if cfg.algorithm == "zstd" and cfg.huffman and cfg.use_nvcomp and huffman.available(st.buffer):
        return _code_huffman(st, todo)
    if cfg.use_nvcomp and entropy.available():
        return _code_nvcomp(cfg, st, todo)
    return _code_cpu(level, st, todo, threads)


class _Staging(threading.local):
    """This thread's pinned staging buffers, reused by every encode call (pinning memory costs
    more than copying it): one per batch of the call, grown, never shrunk."""

    def __init__(self):
        self.buffers: list[torch.Tensor] = []
        self.used = 0


_staging = _Staging()


def begin_encode() -> None:
    """Start a new encode call: the buffers of the previous call (already joined into its
    pack) may be reused."""
    _staging.used = 0


def _to_host(t: torch.Tensor, room: int | None = None) -> np.ndarray:
    """A copy of device bytes in the next staging buffer of this encode call, or with `room`
    in fresh pinned memory (torch's caching allocator) `room` bytes past its start (a view of
    the whole)."""
    if room is not None:
        whole = torch.empty(room + t.numel(), dtype=torch.uint8, pin_memory=t.is_cuda)
        whole[room:].copy_(t)
        return whole.numpy()[room:]
    i, n = _staging.used, t.numel()
    if i == len(_staging.buffers):
        _staging.buffers.append(torch.empty(0, dtype=torch.uint8))
    if _staging.buffers[i].numel() < n:
        _staging.buffers[i] = torch.empty(max(n, 1 << 20), dtype=torch.uint8, pin_memory=t.is_cuda)
    _staging.used += 1
    host = _staging.buffers[i][:n]
    host.copy_(t)
    return host.numpy()


@dataclass
class Payload:
    """The chunks of a batch back to back, on the host."""
    data: np.ndarray
    """uint8 bytes of every chunk."""
    offsets: np.ndarray
    """Each chunk's first byte in `data`."""
    lengths: np.ndarray
    crcs: np.ndarray


def assemble(st: symbols.SymbolStreams, coded: Coded, n_groups: np.ndarray, room: int | None = None) -> Payload:
    """The sparse chunks whose segments are `st`'s rows ([chunks * NCP], NCP per chunk),
    chunk k with n_groups[k] classes; copied to the host as `_to_host` does with `room`."""
    n = n_groups.size
    ncp = st.lengths.shape[0] // n
    events = st.lengths[:, 0].reshape(n, ncp)
    has = ((events > 0) | (st.changed.reshape(n, ncp) > 0)) & (np.arange(ncp) < n_groups[:, None])
    stored = np.where(has[..., None], coded.stored.reshape(n, ncp, 4), 0)
    head, head_len = tables.write(n_groups, events, has, coded.codec.reshape(n, ncp, 4),
                                  st.lengths.reshape(n, ncp, 4), stored)
    body = stored.reshape(n, -1)
    lengths = head_len + body.sum(1)
    offsets = layout.starts(lengths)
    dst = (offsets + head_len)[:, None] + layout.starts(body, 1)
    size = int(lengths.sum())
    crc_at = -(-size // 4) * 4  # the CRCs ride behind the payload in its copy to the host
    out = torch.empty(crc_at + 4 * n, dtype=torch.uint8, device=coded.raw.device)
    raw = coded.codec.ravel() == codecs.RAW
    for src, take in ((coded.raw, raw), (coded.coded, ~raw)):
        gather(src, out, coded.src_off.ravel()[take], dst.ravel()[take], body.ravel()[take])
    gather(layout.upload(head, out.device), out, layout.starts(head_len), offsets, head_len)
    out[crc_at:].view(torch.int32).copy_(crc32(out[:size], offsets, lengths))
    host = _to_host(out, room)
    return Payload(host[:size], offsets, lengths, host[crc_at:].view(np.uint32).astype(np.int64))
