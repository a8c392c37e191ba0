"""Sparse chunks from the GPU's symbol streams: stream coding (Huffman-literal frames or
nvCOMP on the GPU, or the CPU's zstd), then the payload of all chunks of a batch laid out
and written on the GPU (chunk tables, stored streams, the CRC-32 of every chunk), one wait
for the chunks' lengths, one copy to the host; the CRCs are waited for only when the chunk
references are made."""

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda.kernels import encode_symbols, stream_tables
from weight_teleport.codec.cuda.runtime import memory, nvcomp
from weight_teleport.codec.cuda.zstd_literals import gpu_writer
from weight_teleport.codec.cuda import choice
from weight_teleport.codec.cuda.config import NVCOMP_ALGORITHM, CudaCodecConfig
from weight_teleport.codec.cuda.kernels.crc import crc32
from weight_teleport.codec.cuda.kernels.gather import gather
from weight_teleport.codec.cuda.zstd_literals.reference import BLOCK_BYTES

MIN_CODED = 16
"""Streams shorter than this are stored raw (as the CPU backend does)."""
CODEC_ID = nvcomp.CODEC_ID


@dataclass
class Coded:
    """Every stream's stored form, as [segments, 4] int64 device tensors like the symbol
    streams' lengths."""

    codec: torch.Tensor
    """Stream codec ids."""
    stored: torch.Tensor
    """Stored lengths."""
    src_off: torch.Tensor
    """Where each stored stream starts: in the symbol streams' buffer for a raw stream, else
    in `coded`."""
    coded: torch.Tensor
    """Device bytes of the coded streams."""
    frames: Callable[[torch.Tensor, torch.Tensor], None] | None = None
    """Where set, it writes the coded streams into the payload (zeroed int32 words) itself,
    given every stream's offset there, and `coded` is not read."""


def _raw(st: encode_symbols.SymbolStreams) -> Coded:
    return Coded(torch.full_like(st.lengths, codecs.RAW), st.lengths.clone(), st.offsets.clone(), st.buffer[:0])


def _use(c: Coded, which: np.ndarray, codec, stored: np.ndarray, src_off: np.ndarray, coded: torch.Tensor) -> Coded:
    """`c` with the flat streams `which` stored as `codec` at `src_off` of `coded`."""
    c.coded = coded.to(c.codec.device)
    if which.size:
        at, stored_d, src_off_d = memory.to_device([which, stored, src_off], c.codec.device)
        c.codec.view(-1)[at] = codec
        c.stored.view(-1)[at] = stored_d
        c.src_off.view(-1)[at] = src_off_d
    return c


def _to_code(st: encode_symbols.SymbolStreams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat indices, offsets, lengths) of the streams coded, read from the device."""
    offsets, lengths = (a.ravel() for a in st.on_host())
    todo = np.flatnonzero(lengths >= MIN_CODED)
    return todo, offsets[todo], lengths[todo]


def _code_nvcomp(algorithm: str, st: encode_symbols.SymbolStreams) -> Coded:
    todo, off, ln = _to_code(st)
    if not todo.size:
        return _raw(st)
    out, out_off, pending = nvcomp.compress(algorithm, st.buffer, off, ln)
    sizes, statuses = pending.host()
    host = torch.cat([sizes, statuses.long()]).cpu().numpy()
    sizes, statuses = pending.unpermute(host[: ln.size]), pending.unpermute(host[ln.size :])
    if (statuses != 0).any():
        raise RuntimeError(f"nvCOMP {algorithm} failed on {int((statuses != 0).sum())} streams")
    smaller = sizes < ln
    return _use(_raw(st), todo[smaller], CODEC_ID[algorithm], sizes[smaller], out_off[smaller], out)


def _code_cpu(level: int, st: encode_symbols.SymbolStreams, threads: int) -> Coded:
    todo, off, ln = _to_code(st)
    raw_host = st.buffer.cpu().numpy()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        out = list(pool.map(lambda a: codecs.encode_stream(raw_host[a[0] : a[0] + a[1]], level), zip(off, ln)))
    smaller = np.array([cid == codecs.ZSTD for cid, _ in out], bool)
    data = [d for (cid, d), s in zip(out, smaller) if s]
    sizes = np.array([len(d) for d in data], np.int64)
    blob = torch.frombuffer(bytearray(b"".join(data)), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    return _use(_raw(st), todo[smaller], codecs.ZSTD, sizes, memory.starts(sizes), blob)


def _code_huffman(st: encode_symbols.SymbolStreams) -> Coded:
    """Huffman-literal zstd frames written on the GPU (codec/cuda/zstd_literals/gpu_writer.py), for each
    stream of at least MIN_CODED bytes where it is smaller; nothing syncs (the launch is
    sized by a bound on the blocks from the host's segment bytes)."""
    max_blocks = int(st.segment_bytes.sum()) // BLOCK_BYTES + st.lengths.numel()
    p = gpu_writer.plan(st.buffer, st.offsets, st.lengths, MIN_CODED, max_blocks)
    c = _raw(st)
    raw, sizes = c.stored.view(-1), gpu_writer.frame_sizes(p)
    take = (raw >= MIN_CODED) & (sizes < raw)
    c.codec.view(-1)[:] = torch.where(take, codecs.ZSTD, codecs.RAW)
    c.stored.view(-1)[:] = torch.where(take, sizes, raw)
    c.frames = lambda out, dst: gpu_writer.write(st.buffer, p, take, dst, out)
    return c


def code(st: encode_symbols.SymbolStreams, cfg: CudaCodecConfig, level: int, threads: int) -> Coded:
    """The stored form of every stream, by the stream coder `choice.stream_coder` picks:
    Huffman-literal frames (GPU), nvCOMP or the CPU's zstd where that is smaller, raw
    otherwise and for streams shorter than MIN_CODED."""
    coder = choice.stream_coder(cfg, st.buffer)
    if coder == "huffman":
        return _code_huffman(st)
    if coder == "cpu-zstd":
        return _code_cpu(level, st, threads)
    return _code_nvcomp(NVCOMP_ALGORITHM[coder], st)


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


def _to_host(t: torch.Tensor, room: int | None = None) -> tuple[np.ndarray, torch.cuda.Event | None]:
    """A copy of device bytes in the next staging buffer of this encode call, or with `room`
    in fresh pinned memory (torch's caching allocator) `room` bytes past its start (a view of
    the whole array, as format.write_pack_into takes it); and the event to wait for before
    reading it (None: copied already)."""
    if room is not None:
        host = torch.empty(room + t.numel(), dtype=torch.uint8, pin_memory=t.is_cuda)
        at = room
    else:
        i, at = _staging.used, 0
        if i == len(_staging.buffers):
            _staging.buffers.append(torch.empty(0, dtype=torch.uint8))
        if _staging.buffers[i].numel() < t.numel():
            _staging.buffers[i] = torch.empty(max(t.numel(), 1 << 20), dtype=torch.uint8, pin_memory=t.is_cuda)
        _staging.used += 1
        host = _staging.buffers[i]
    host[at : at + t.numel()].copy_(t, non_blocking=True)
    copied = None
    if t.is_cuda:
        copied = torch.cuda.Event()
        copied.record()
    return host.numpy()[at : at + t.numel()], copied


@dataclass
class Payload:
    """The chunks of a batch back to back, on the host."""

    data: np.ndarray
    """uint8 bytes of every chunk."""
    offsets: np.ndarray
    """Each chunk's first byte in `data`."""
    lengths: np.ndarray
    crcs: np.ndarray
    """The chunks' CRC-32s as int32 patterns, once `crcs_known` has passed (`crc_list`)."""
    copied: torch.cuda.Event | None
    """Recorded after the copy of `data` from the device: wait for it before reading `data`
    (None: copied already)."""
    crcs_known: torch.cuda.Event | None

    @functools.cached_property
    def crc_list(self) -> list:
        """The chunks' CRC-32s as ints, waited for: they are computed beside the payload's
        copy, so the host lays out what does not need them first."""
        memory.wait(self.crcs_known)
        return (self.crcs.astype(np.int64) & 0xFFFFFFFF).tolist()


def assemble(st: encode_symbols.SymbolStreams, coded: Coded, n_groups: np.ndarray, room: int | None = None) -> Payload:
    """The sparse chunks whose segments are `st`'s rows ([chunks * NCP], NCP per chunk),
    chunk k with n_groups[k] classes, laid out and written on the device (tables, streams,
    CRCs) into a buffer of their largest size. The host waits for the chunks' lengths (known
    before the streams are written) and queues the payload's copy as `_to_host` does with
    `room`; the CRCs are computed on a stream of their own beside the copy
    (`Payload.crc_list` waits for them)."""
    n = n_groups.size
    ncp = st.lengths.shape[0] // n
    dev, raw_len, changed = st.buffer.device, st.lengths, st.changed
    groups = memory.upload(n_groups.astype(np.int64), dev)
    events = raw_len[:, 0].reshape(n, ncp)
    has = ((events > 0) | (changed.reshape(n, ncp) > 0)) & (torch.arange(ncp, device=dev) < groups[:, None])
    body = torch.where(has[..., None], coded.stored.view(n, ncp, 4), 0).view(n, -1)
    heads = stream_tables.Tables(groups, events, has, coded.codec, raw_len, body)
    head_len = heads.lengths()
    lengths = head_len + body.sum(1)
    host_lengths, lengths_known = memory.to_pinned(lengths)
    offsets = memory.starts(lengths)
    dst = (offsets + head_len)[:, None] + memory.starts(body, 1)
    # stored streams are no longer than raw
    bounds = stream_tables.max_length(ncp) + st.segment_bytes.reshape(n, ncp).sum(1)
    out = torch.zeros(-(-int(bounds.sum()) // 4) * 4, dtype=torch.uint8, device=dev)
    heads.write(out, offsets)
    raw = coded.codec.view(n, -1) == codecs.RAW
    gather(st.buffer, out, coded.src_off, dst, torch.where(raw, body, 0))
    if coded.frames is None:
        gather(coded.coded, out, coded.src_off, dst, torch.where(raw, 0, body))
    else:
        coded.frames(out.view(torch.int32), dst)
    crcs, crcs_known = _side_crcs(out, offsets, lengths, bounds)
    memory.wait(lengths_known)
    size = int(host_lengths.sum())
    data, copied = _to_host(out[:size], room)
    return Payload(data, memory.starts(host_lengths), host_lengths, crcs, copied, crcs_known)


def _side_crcs(
    out: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, bounds: np.ndarray
) -> tuple[np.ndarray, torch.cuda.Event | None]:
    """The chunks' CRC-32s (int32 patterns) as `memory.to_pinned` gives them, computed on the CRC
    stream, which waits for the payload's kernels queued so far: they run beside the
    payload's copy to the host, queued next on the caller's stream."""
    if not out.is_cuda:
        return memory.to_pinned(crc32(out, offsets, lengths, bounds))
    main = torch.cuda.current_stream(out.device)
    side = memory.side_stream(out.device, "crc")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        for t in (out, offsets, lengths):
            t.record_stream(side)
        return memory.to_pinned(crc32(out, offsets, lengths, bounds))
