"""Snapshots of CUDA tensors written and read on the GPU (codec `dense_values`).

A dense chunk is one group of `width` byte planes (docs/FORMAT.md); here every plane is
stored raw, so a chunk is its small table and then its planes, and writing or reading one
is a transpose of its bytes. The encoder lays out every chunk on the host, transposes the
tensors into a device buffer a wave at a time, computes the chunks' CRC-32s and the
tensors' digests on the device, and copies each wave into the pinned host payload while the
next one is transposed: device memory stays at two waves, and the copy to the host bounds
the time. The stage copies a snapshot's chunks to the device a wave at a time, checks
their CRC-32s and tables, transposes them back into the new weights and checks each
tensor's digest before anything is written. Streams coded by other writers (zstd planes
of the CPU encoder) are left to the CPU backend."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.crc import crc32
from weight_teleport.codec.cuda.kernels.digest import word_sums
from weight_teleport.codec.cuda.live import Live
from weight_teleport.codec.items import EncodeItem
from weight_teleport.codec.streams import RAW
from weight_teleport.errors import DigestMismatchError, PackFormatError
from weight_teleport.format import Group, TensorRecord, read_groups
from weight_teleport.format.groups import write_table
from weight_teleport.format.container import ChunkSpans, prefix_bound
from weight_teleport.host_memory import fill

WAVE_BYTES = 1 << 30
"""Bytes of chunks transposed and moved per wave (at least one chunk)."""
BLOCK = 4096


@triton.jit
def _planes_kernel(
    src_ptr, dst_ptr, plane_ptr, n, chunk_elems, WIDTH: tl.constexpr, TO_PLANES: tl.constexpr, BLOCK: tl.constexpr
):
    """Between a tensor's bytes (`src`, element e's byte b at e * WIDTH + b) and its chunks'
    byte planes (chunk c's plane b at plane[c] + b * count + e - c * chunk_elems in `dst`):
    to the planes when TO_PLANES, else back."""
    c = tl.program_id(0).to(tl.int64)
    lo = c * chunk_elems
    count = tl.minimum(chunk_elems, n - lo)
    i = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < count
    plane = tl.load(plane_ptr + c)
    for b in tl.static_range(WIDTH):
        at_src = src_ptr + (lo + i) * WIDTH + b
        at_dst = dst_ptr + plane + b * count + i
        if TO_PLANES:
            tl.store(at_dst, tl.load(at_src, mask=live), mask=live)
        else:
            tl.store(at_src, tl.load(at_dst, mask=live), mask=live)


def _transpose(
    tensor_bytes: torch.Tensor,
    buffer: torch.Tensor,
    planes: list[int] | np.ndarray,
    n: int,
    chunk_elems: int,
    width: int,
    to_planes: bool,
) -> None:
    if not len(planes):
        return
    plane_at = memory.upload(np.asarray(planes, np.int64), buffer.device)
    grid = (len(planes), triton.cdiv(min(chunk_elems, n), BLOCK))
    _planes_kernel[grid](tensor_bytes, buffer, plane_at, n, chunk_elems, WIDTH=width, TO_PLANES=to_planes, BLOCK=BLOCK)


def chunk_table(count: int, width: int) -> bytes:
    """The table of a dense chunk of `count` elements whose `width` planes are stored raw."""
    return write_table([(count, [(RAW, count, count)] * width)])


@dataclass
class _Chunk:
    item: int
    """Index of the tensor."""
    index: int
    """Index of the chunk in its tensor."""
    offset: int
    """Offset of the chunk in the payload."""
    table: bytes
    count: int
    """Elements of the chunk."""
    width: int
    """Bytes of an element."""

    @property
    def length(self) -> int:
        return len(self.table) + self.count * self.width


def _lay_out(numels: list[int], widths: list[int], chunk_elems: int) -> list[_Chunk]:
    """Every chunk of tensors of `numels` elements of `widths` bytes, end to end."""
    out, at, tables = [], 0, dict[tuple[int, int], bytes]()
    for i, (n, w) in enumerate(zip(numels, widths)):
        for k, lo in enumerate(range(0, n, chunk_elems)):
            count = min(chunk_elems, n - lo)
            table = tables.get((count, w)) or tables.setdefault((count, w), chunk_table(count, w))
            out.append(_Chunk(i, k, at, table, count, w))
            at += out[-1].length
    return out


def _waves(chunks: list[_Chunk]) -> list[list[_Chunk]]:
    """Runs of consecutive chunks of at most WAVE_BYTES bytes (a longer chunk alone)."""
    waves, cur, size, limit = [], list[_Chunk](), 0, WAVE_BYTES
    for ch in chunks:
        if cur and size + ch.length > limit:
            waves.append(cur)
            cur, size = [], 0
        cur.append(ch)
        size += ch.length
    return waves + ([cur] if cur else [])


def _wave_tables(wave: list[_Chunk], lo: int, buffer: torch.Tensor) -> None:
    """Write the wave's chunk tables into `buffer` (the wave's bytes from payload offset lo)."""
    data = np.frombuffer(bytearray(b"".join(ch.table for ch in wave)), np.uint8)
    at = np.concatenate([np.arange(len(ch.table)) + ch.offset - lo for ch in wave])
    data_d, at_d = memory.upload(data, buffer.device), memory.to_device([at], buffer.device)[0]
    buffer.index_copy_(0, at_d, data_d)


def _spans(chunks: list[_Chunk]) -> list[list[_Chunk]]:
    """Runs of chunks in payload order whose span (first offset to last end, gaps
    included) is at most WAVE_BYTES (a longer chunk alone)."""
    waves: list[list[_Chunk]] = []
    for ch in chunks:
        if waves and ch.offset + ch.length - waves[-1][0].offset <= WAVE_BYTES:
            waves[-1].append(ch)
        else:
            waves.append([ch])
    return waves


def _runs(part: list[_Chunk]) -> list[list[_Chunk]]:
    """`part` cut where chunk indices stop following each other (one launch per run)."""
    runs: list[list[_Chunk]] = []
    for ch in part:
        if runs and ch.index == runs[-1][-1].index + 1:
            runs[-1].append(ch)
        else:
            runs.append([ch])
    return runs


def _by_item(wave: list[_Chunk]) -> dict[int, list[_Chunk]]:
    out: dict[int, list[_Chunk]] = {}
    for ch in wave:
        out.setdefault(ch.item, []).append(ch)
    return out


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class _Ring:
    """Two device buffers that waves take in turn; a buffer is reused once the copy that read
    or filled it is done. Without CUDA (Triton's interpreter) it is one host buffer."""

    def __init__(self, size: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2 if self.cuda else 1)]
        self.done: list[torch.cuda.Event | None] = [None] * len(self.buffers)
        self.copier = memory.side_stream(device, "dense-copy") if self.cuda else None
        self.turn = 0

    def take(self) -> tuple[int, torch.Tensor]:
        k = self.turn % len(self.buffers)
        self.turn += 1
        done = self.done[k]
        if done is not None:
            torch.cuda.current_stream().wait_event(done)
        return k, self.buffers[k]

    def copy(self, k: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- src (one holds buffer k), on the copy stream after the caller's work so far."""
        if not self.cuda:
            dst.copy_(src)
            return
        assert self.copier is not None  # made on CUDA
        self.copier.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copier):
            dst.copy_(src, non_blocking=True)
            done = self.done[k] = torch.cuda.Event()
            done.record()

    def finish(self) -> None:
        """The caller's stream waits for every copy."""
        for ev in self.done:
            if ev is not None:
                torch.cuda.current_stream().wait_event(ev)


class _Inbound:
    """Two device buffers that waves of a pack's bytes fill in turn on a copy stream: the
    kernels of a wave wait for its copy, and a buffer is filled again only once the kernels
    that read it are done, so the next wave's copy overlaps this wave's kernels. A pack in
    pageable memory goes through two pinned buffers that host threads fill while the
    previous wave crosses (a copy from pageable memory is slower and blocks the host).
    Without CUDA (Triton's interpreter) it is one host buffer."""

    def __init__(self, size: int, device: torch.device, pinned_source: bool):
        self.cuda = device.type == "cuda"
        n = 2 if self.cuda else 1
        self.buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(n)]
        self.read: list[torch.cuda.Event | None] = [None] * n
        self.staging = (
            None
            if pinned_source or not self.cuda
            else [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
        )
        self.sent: list[torch.cuda.Event | None] = [None] * n
        self.copier = memory.side_stream(device, "dense-copy") if self.cuda else None
        self.turn = 0

    def fill(self, src: torch.Tensor) -> torch.Tensor:
        """The next buffer holding `src` (host bytes), for the caller's stream."""
        k = self.turn % len(self.buffers)
        buf = self.buffers[k][: src.numel()]
        if not self.cuda:
            buf.copy_(src)
            return buf
        if self.staging is not None:
            sent = self.sent[k]
            if sent is not None:
                sent.synchronize()  # the copy out of this staging buffer is done
            host = self.staging[k][: src.numel()]
            fill(host.numpy(), [src.numpy()])
            src = host
        assert self.copier is not None  # made on CUDA
        with torch.cuda.stream(self.copier):
            read = self.read[k]
            if read is not None:
                self.copier.wait_event(read)
            buf.copy_(src, non_blocking=True)
            self.sent[k] = filled = torch.cuda.Event()
            filled.record()
        torch.cuda.current_stream().wait_event(filled)
        return buf

    def release(self) -> None:
        """The caller's kernels that read the buffer `fill` gave last are all launched."""
        if self.cuda:
            self.read[self.turn % len(self.buffers)] = done = torch.cuda.Event()
            done.record()
        self.turn += 1


def encode(items: list[EncodeItem], chunk_elems: int, pinned: bool, host_empty):
    """Records (codec `dense_values`, raw planes), the payload as one part and `ready()`,
    like the sparse encoder's. `host_empty(n)`: n bytes of host memory (pinned: the copies
    from the device go there directly); with `pinned` the payload lies behind room for the
    pack's preamble and header (format.write_pack_into writes the pack around it)."""
    widths = [it.info.nbytes for it in items]
    chunks = _lay_out([it.new.numel() for it in items], widths, chunk_elems)
    total = chunks[-1].offset + chunks[-1].length if chunks else 0
    records = [
        TensorRecord(
            name=it.name, dtype=it.info.name, shape=it.shape, codec="dense_values", digest="", changed=it.new.numel()
        )
        for it in items
    ]
    room = prefix_bound(records, len(chunks)) if pinned else 0
    host = host_empty(room + total)
    payload = host[room:]
    device = items[0].new.device if items else torch.device("cpu")
    sums = word_sums([it.new for it in items]) if items else None
    crcs = []
    if chunks:
        ring = _Ring(max(sum(ch.length for ch in w) for w in _waves(chunks)), device)
        host_t = torch.from_numpy(payload)
        for wave in _waves(chunks):
            lo, hi = wave[0].offset, wave[-1].offset + wave[-1].length
            k, buf = ring.take()
            _wave_tables(wave, lo, buf)
            for i, part in _by_item(wave).items():
                it, first = items[i], part[0].index
                src = _bytes_of(it.new)[first * chunk_elems * widths[i] :]
                planes = [ch.offset - lo + len(ch.table) for ch in part]
                _transpose(src, buf, planes, it.new.numel() - first * chunk_elems, chunk_elems, widths[i], True)
            crcs.append(crc32(buf[: hi - lo], [ch.offset - lo for ch in wave], [ch.length for ch in wave]))
            ring.copy(k, host_t[lo:hi], buf[: hi - lo])
        ring.finish()
    # one read-back, behind the copies of every wave (ring.finish): the payload is complete
    back = (
        torch.cat([sums, *[c.long() & 0xFFFFFFFF for c in crcs]]).cpu().numpy()
        if sums is not None
        else np.zeros(0, np.int64)
    )
    for rec, it, s in zip(records, items, back[: len(items)].tolist()):
        rec.digest = D.to_hex(D.finish(s & D.MASK64, it.new.numel() * it.info.nbytes))
    for ch, crc in zip(chunks, back[len(items) :].tolist()):
        records[ch.item].chunks.append((ch.offset, ch.length, int(crc)))
    return records, [payload], lambda: None


def _host_bytes(pack) -> torch.Tensor:
    """The pack's bytes as a uint8 tensor without a copy (pinned memory where it lies there:
    the device then copies from it directly)."""
    pinned = memory.pinned(pack)
    if pinned is not None:
        return pinned
    with warnings.catch_warnings():  # read only: torch warns that the buffer is not writable
        warnings.simplefilter("ignore")
        return torch.frombuffer(memoryview(pack), dtype=torch.uint8)


def raw_planes(header, pack, recs) -> bool:
    """Whether every chunk of `recs` (dense_values) holds raw planes of whole chunks: the
    form this module reads on the device (the tables are read from the host's pack)."""
    data = memoryview(pack)[header.payload_offset :]
    for rec in recs:
        for ref in rec.chunks:
            table = _table_of(data, ref)
            if table is None:
                return False
    return True


def _table_of(data: memoryview, ref) -> list[Group] | None:
    """The groups of a chunk when its streams are raw planes, else None."""
    offset, length = ref[0], ref[1]
    try:
        groups = read_groups(data[offset : offset + length])
    except PackFormatError:
        return None
    if len(groups) != 1 or any(s.codec != RAW for s in groups[0].streams):
        return None
    return groups


def stage(lives: dict[str, Live], header, pack, recs: list[TensorRecord], chunk_elems: int) -> dict:
    """{name: [(0, new bit patterns)]} of the snapshot records `recs` (every chunk raw
    planes, `raw_planes`), decoded on the device and verified: chunk CRC-32s, tables and
    each tensor's digest. Raises PackFormatError or DigestMismatchError; writes nothing."""
    if not recs:
        return {}
    device = lives[recs[0].name].tensor.device
    data = memoryview(pack)[header.payload_offset :]
    numels = [r.numel for r in recs]
    widths = [lives[r.name].info.nbytes for r in recs]
    chunks = _lay_out(numels, widths, chunk_elems)
    refs = [ref for r in recs for ref in r.chunks]
    if len(refs) != len(chunks):
        raise PackFormatError("a dense tensor has the wrong number of chunks")
    for ch, ref in zip(chunks, refs):
        groups = _table_of(data, ref)
        if (
            groups is None
            or ref[1] != ch.length
            or groups[0].count != ch.count
            or any(s.raw_len != ch.count or len(s.data) != ch.count for s in groups[0].streams)
            or len(groups[0].streams) != widths[ch.item]
        ):
            raise PackFormatError(f"dense chunk {ch.index} of tensor {recs[ch.item].name!r} does not fit its tensor")
        ch.offset = ref[0]  # where the pack has it (a writer may order chunks otherwise)
    values = [torch.empty(n, dtype=lives[r.name].info.int_torch, device=device) for r, n in zip(recs, numels)]
    src = _host_bytes(pack)
    spans = ChunkSpans.of(header, recs)
    order = sorted(range(len(chunks)), key=lambda j: chunks[j].offset)
    waves = _spans([chunks[j] for j in order])
    ring = _Inbound(
        max(w[-1].offset + w[-1].length - w[0].offset for w in waves),
        device,
        pinned_source=memory.pinned(pack) is not None,
    )
    crcs = []
    for wave in waves:  # a wave of chunks in payload order: one copy, one CRC launch
        lo, hi = wave[0].offset, wave[-1].offset + wave[-1].length
        buf = ring.fill(src[header.payload_offset + lo : header.payload_offset + hi])
        crcs.append(crc32(buf, [ch.offset - lo for ch in wave], [ch.length for ch in wave]))
        for i, part in _by_item(wave).items():
            for run in _runs(part):
                first = run[0].index
                dst = _bytes_of(values[i])[first * chunk_elems * widths[i] :]
                planes = [ch.offset - lo + len(ch.table) for ch in run]
                _transpose(dst, buf, planes, numels[i] - first * chunk_elems, chunk_elems, widths[i], False)
        ring.release()
    sums = word_sums(values)
    back = torch.cat([sums, *[c.long() & 0xFFFFFFFF for c in crcs]]).cpu().numpy()
    got = np.empty(len(chunks), np.int64)
    got[order] = back[len(recs) :]
    spans.compare(got)
    for r, v, s in zip(recs, values, back[: len(recs)].tolist()):
        nbytes = v.numel() * v.element_size()
        if D.to_hex(D.finish(s & D.MASK64, nbytes)) != r.digest:
            raise DigestMismatchError(
                f"tensor {r.name!r}: the snapshot's weights do not have the digest it "
                f"promises ({r.digest}); the pack is corrupt or was encoded from other weights"
            )
    return {r.name: [(0, v)] for r, v in zip(recs, values)}
