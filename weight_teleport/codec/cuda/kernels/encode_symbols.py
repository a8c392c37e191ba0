"""Symbol coding of sparse classes on the GPU, batched over every (chunk, class) segment of
every tensor of one element width: the four byte streams of docs/FORMAT.md ("Codec
sparse"), byte-identical to the CPU's `class_to_symbols`, written into one buffer of
SLOT_ALIGN-aligned slots.

Inputs are per segment: its events' class ranks (ascending) and the residuals of its
changed elements (in a non-inverted class, one per event). Two launches over the segments:
the first counts the bytes of each stream (the slots are laid out from them on the device;
the step's one transfer reads only the buffer's size and each segment's bytes), the second
writes them. Where NVRTC compiles for the GPU, the kernels are CUDA C (encode_symbols.cu beside
this: a warp per segment, each whole word of extra bits stored once); elsewhere (Triton's
CPU interpreter, GPUs NVRTC cannot reach) the Triton kernel here, a program per segment
walking its events and residuals in tiles, whose extra bits are ORed into the zeroed
buffer by global atomics (the CUDA C kernel stores each word once instead, and writes
faster). The Triton kernel's integer arithmetic is int64, which wraps like the format's
unsigned arithmetic; comparisons of values that may reach 2^63 go through `_uge`."""

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.kernels import warp
from weight_teleport.codec.cuda.runtime import memory, nvrtc
from weight_teleport.codec.cuda.runtime.nvcomp import SLOT_ALIGN

RC = 5
ESCAPE = 255
_RC = tl.constexpr(RC)
_ESCAPE = tl.constexpr(ESCAPE)
TILE = 1024
"""Events (or residuals) a segment's program codes at once."""
SOURCE = Path(__file__).with_name("encode_symbols.cu")
"""The CUDA C kernels (tests/codec/test_codec_warp_compile.py compiles them without a GPU)."""
SEG_WARPS = 4
"""Segments (a warp each) of a CTA of the CUDA C kernels."""


@functools.cache
def _module(bits: int) -> nvrtc.Module:
    return nvrtc.Module(SOURCE.read_text(), SOURCE.name, {"BITS": bits, "SEG_WARPS": SEG_WARPS})


@dataclass
class Segments:
    """Tables of the segments, in stream order (host arrays or device tensors)."""

    ev_cnt: np.ndarray | torch.Tensor
    """Events of each segment (int64)."""
    res_cnt: np.ndarray | torch.Tensor
    """Changed elements of each segment (int64)."""
    inverted: np.ndarray | torch.Tensor
    """bool: the segment's class codes the unchanged elements."""
    bits: int
    """Element width of every segment's tensor."""
    pieces: tuple = ()
    """Where the events' ranks and residuals are in several tensors: the segments of each,
    in order (empty: one piece)."""


@dataclass
class SymbolStreams:
    """The four streams of every segment in one device buffer."""

    buffer: torch.Tensor
    """uint8, every stream at its slot."""
    offsets: torch.Tensor
    """[segments, 4] int64 slot offsets (SLOT_ALIGN-aligned; device)."""
    lengths: torch.Tensor
    """[segments, 4] int64 stream lengths (device)."""
    changed: torch.Tensor
    """Changed elements of each segment (int64, device)."""
    segment_bytes: np.ndarray
    """Each segment's four stream lengths summed (int64, host)."""

    def on_host(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, lengths) on the host (a sync)."""
        both = torch.stack([self.offsets, self.lengths]).cpu().numpy()
        return both[0], both[1]


@triton.jit
def _uge(x, k):
    """x >= k for int64 x read as unsigned."""
    return (x >= k) | (x < 0)


@triton.jit
def _gaps(ranks_ptr, at, j, m):
    """(extra-bit count, bucket, extra bits) of the events j of a segment whose ranks start at
    `at`: the gap v = rank - previous rank (the first counts from -1) as bucket and bits."""
    r = tl.load(ranks_ptr + at + j, mask=m, other=0).to(tl.int64)
    prev = tl.load(ranks_ptr + at + j - 1, mask=m & (j > 0), other=-1).to(tl.int64)
    v = tl.where(m, r - prev, 1)
    top = (v.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127  # floor(log2 v): gaps < 2^22 are exact
    ne = tl.maximum(top - 1, 0).to(tl.int64)
    bucket = tl.where(v == 1, 0, 2 * top.to(tl.int64) - 1 + ((v >> ne) & 1))
    return tl.where(m, ne, 0), bucket, v & ((tl.full(v.shape, 1, tl.int64) << ne) - 1)


@triton.jit
def _zigzag(r, BITS: tl.constexpr):
    """+1 -> 0, -1 -> 1, +2 -> 2, ... of residuals r != 0 of width BITS (int64)."""
    neg = ((r >> (BITS - 1)) & 1) != 0
    if BITS == 64:
        wm = tl.full(r.shape, -1, tl.int64)
    else:
        wm = tl.full(r.shape, (1 << BITS) - 1, tl.int64)
    return tl.where(neg, (wm - r) * 2 + 1, (r - 1) * 2)


@triton.jit
def unzigzag(z, BITS: tl.constexpr):
    """The residual (int64, low BITS bits) of zigzag code `z`: the inverse of `_zigzag`."""
    if BITS == 64:
        r = tl.where((z & 1) != 0, -1 - (z >> 1), (z >> 1) + 1)
    else:
        r = tl.where((z & 1) != 0, ((1 << BITS) - 1 - (z >> 1)) & ((1 << BITS) - 1), (z >> 1) + 1)
    return r


@triton.jit
def _residual(res_ptr, at, j, m, other, BITS: tl.constexpr):
    """Residuals j of a segment whose residuals start at `at`, stored in the elements' width,
    as int64 (zero-extended below 64 bits)."""
    r = tl.load(res_ptr + at + j, mask=m, other=other).to(tl.int64)
    if BITS < 64:
        r = r & ((1 << BITS) - 1)
    return r


@triton.jit
def _residual_symbols(res_ptr, at, j, m, inv, BITS: tl.constexpr):
    """(residual, whether it has a residual symbol, whether that escapes, the symbol)."""
    res = _residual(res_ptr, at, j, m, 0, BITS)
    zz = _zigzag(res, BITS)
    flag = m & (inv | _uge(zz, _RC - 1))
    sym = tl.where(inv, zz, zz - (_RC - 1))
    esc = flag & _uge(sym, _ESCAPE)
    return res, flag, esc, tl.where(esc, _ESCAPE, sym)


@triton.jit
def segment(s, ev_cnt_ptr, ev_start_ptr, res_cnt_ptr, res_start_ptr, inv_ptr):
    """(events, first event, changed elements, first residual, inverted) of segment `s`."""
    return (
        tl.load(ev_cnt_ptr + s),
        tl.load(ev_start_ptr + s),
        tl.load(res_cnt_ptr + s),
        tl.load(res_start_ptr + s),
        tl.load(inv_ptr + s) != 0,
    )


@triton.jit
def _symbols_kernel(
    ranks_ptr,
    res_ptr,
    ev_cnt_ptr,
    ev_start_ptr,
    res_cnt_ptr,
    res_start_ptr,
    inv_ptr,
    off_ptr,
    buf_ptr,
    words_ptr,
    counts_ptr,
    BITS: tl.constexpr,
    T: tl.constexpr,
    WRITE: tl.constexpr,
):
    """One segment's streams: without WRITE, its extra bits, residual symbols and escapes
    counted into `counts_ptr` (the slots are laid out from them); with WRITE, its four
    streams written at its slots `off_ptr`."""
    s = tl.program_id(0).to(tl.int64)
    n_ev, ev0, n_res, res0, inv = segment(s, ev_cnt_ptr, ev_start_ptr, res_cnt_ptr, res_start_ptr, inv_ptr)
    if WRITE:
        sym_at, bit_word = tl.load(off_ptr + s * 4), tl.load(off_ptr + s * 4 + 1) // 4
        rsym_at, esc_at = tl.load(off_ptr + s * 4 + 2), tl.load(off_ptr + s * 4 + 3)
    # streams 1 and 2: event symbols (gap bucket and the residual's code) and extra bits
    bits = tl.zeros((), tl.int64)
    t = tl.zeros((), tl.int64)
    while t < n_ev:
        j = t + tl.arange(0, T).to(tl.int64)
        m = j < n_ev
        ne, bucket, extra = _gaps(ranks_ptr, ev0, j, m)
        if WRITE:
            zz = _zigzag(_residual(res_ptr, res0, j, m & ~inv, 1, BITS), BITS)
            rc = tl.where(inv, 0, tl.where(_uge(zz, _RC - 1), _RC - 1, zz))
            tl.store(buf_ptr + sym_at + j, (bucket * _RC + rc).to(tl.uint8), mask=m)
            at = bits + tl.cumsum(ne, 0) - ne
            sh = at & 31
            lo = ((extra << sh) & 0xFFFFFFFF).to(tl.uint32).to(tl.int32, bitcast=True)
            hi = (extra >> (32 - sh)).to(tl.uint32).to(tl.int32, bitcast=True)
            tl.atomic_or(words_ptr + bit_word + (at >> 5), lo, mask=m & (ne > 0), sem="relaxed")
            tl.atomic_or(words_ptr + bit_word + (at >> 5) + 1, hi, mask=m & (ne > 0) & (sh + ne > 32), sem="relaxed")
        bits += tl.sum(ne, 0)
        t += T
    # streams 3 and 4: residual symbols and the escaped residuals' bytes
    NB: tl.constexpr = BITS // 8
    n_sym = tl.zeros((), tl.int64)
    n_esc = tl.zeros((), tl.int64)
    t = tl.zeros((), tl.int64)
    while t < n_res:
        j = t + tl.arange(0, T).to(tl.int64)
        res, flag, esc, sym = _residual_symbols(res_ptr, res0, j, j < n_res, inv, BITS)
        if WRITE:
            k = n_sym + tl.cumsum(flag.to(tl.int64), 0) - flag.to(tl.int64)
            tl.store(buf_ptr + rsym_at + k, sym.to(tl.uint8), mask=flag)
            e = n_esc + tl.cumsum(esc.to(tl.int64), 0) - esc.to(tl.int64)
            for b in tl.static_range(NB):
                tl.store(buf_ptr + esc_at + e * NB + b, ((res >> (8 * b)) & 0xFF).to(tl.uint8), mask=esc)
        n_sym += tl.sum(flag.to(tl.int64), 0)
        n_esc += tl.sum(esc.to(tl.int64), 0)
        t += T
    if not WRITE:
        tl.store(counts_ptr + s * 3, bits)
        tl.store(counts_ptr + s * 3 + 1, n_sym)
        tl.store(counts_ptr + s * 3 + 2, n_esc)


def _pieces(
    ranks: list[torch.Tensor],
    res: list[torch.Tensor],
    seg: Segments,
    ev_cnt: torch.Tensor,
    res_cnt: torch.Tensor,
    inv: torch.Tensor,
) -> list[tuple[tuple, int, int]]:
    """(the kernels' leading arguments, first segment, segments) of each piece of the
    segments that has any."""
    sizes = list(seg.pieces) if seg.pieces else [ev_cnt.numel()]
    assert len(ranks) == len(res) == len(sizes) and sum(sizes) == ev_cnt.numel()
    out, a = [], 0
    for r, x, n in zip(ranks, res, sizes):
        e, c = ev_cnt[a : a + n], res_cnt[a : a + n]
        if n:
            out.append(((r, x, e, memory.starts(e), c, memory.starts(c), inv[a : a + n]), a, n))
        a += n
    return out


def encode(ranks: list[torch.Tensor], res: list[torch.Tensor], seg: Segments) -> SymbolStreams:
    """The streams of all segments from their event ranks (int32) and residuals (integers
    of `seg.bits` bits, read as unsigned), each concatenated over its segments: a tensor
    each, or one per piece of the segments (`seg.pieces`)."""
    dev = ranks[0].device
    for r, x in zip(ranks, res):
        assert r.dtype == torch.int32 and x.dtype.itemsize * 8 == seg.bits and not x.dtype.is_floating_point
        assert memory.on_device(r) and r.is_contiguous() and x.is_contiguous()
    ev_cnt = torch.as_tensor(seg.ev_cnt, device=dev).long().contiguous()
    res_cnt = torch.as_tensor(seg.res_cnt, device=dev).long().contiguous()
    inv = torch.as_tensor(seg.inverted, device=dev).to(torch.int8).contiguous()
    pieces = _pieces(ranks, res, seg, ev_cnt, res_cnt, inv)
    n_seg = ev_cnt.numel()
    counts = torch.zeros((max(n_seg, 1), 3), dtype=torch.int64, device=dev)
    fast = n_seg and warp.available(ranks[0])
    for args, a, n in pieces:
        if fast:
            _module(seg.bits).launch(
                "segment_counts", -(-n // SEG_WARPS), SEG_WARPS * 32, [*args, counts[a : a + n], n], dev
            )
        else:
            unused = args[0]  # the slot and buffer pointers, not read when counting
            _symbols_kernel[(n,)](*args, unused, unused, unused, counts[a : a + n], BITS=seg.bits, T=TILE, WRITE=False)
    c = counts[:n_seg]
    lengths = torch.stack([ev_cnt, (c[:, 0] + 7) // 8, c[:, 1], c[:, 2] * (seg.bits // 8)], 1)
    slots = (lengths + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN
    offsets = memory.starts(slots.view(-1)).view(lengths.shape)
    sums = torch.stack([slots.sum(), ev_cnt.sum(), res_cnt.sum()])
    host = torch.cat([sums, lengths.sum(1)]).cpu().numpy()  # the step's one transfer
    assert sum(r.numel() for r in ranks) == host[1] and sum(x.numel() for x in res) == host[2]
    buf = torch.zeros(int(host[0]) + 2 * SLOT_ALIGN, dtype=torch.uint8, device=dev)
    for args, a, n in pieces:
        if fast:
            _module(seg.bits).launch(
                "segment_symbols", -(-n // SEG_WARPS), SEG_WARPS * 32, [*args, offsets[a : a + n], buf, n], dev
            )
        else:
            _symbols_kernel[(n,)](
                *args, offsets[a : a + n], buf, buf.view(torch.int32), counts, BITS=seg.bits, T=TILE, WRITE=True
            )
    return SymbolStreams(buf, offsets, lengths, res_cnt, host[3:])
