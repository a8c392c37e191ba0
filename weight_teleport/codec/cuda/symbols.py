"""Symbol coding of sparse classes on the GPU, batched over every (chunk, class) segment of
every tensor of one element width: the four byte streams of docs/FORMAT.md ("Codec
sparse"), byte-identical to the CPU's `class_to_symbols`, written into one buffer of
SLOT_ALIGN-aligned slots.

Inputs are per segment: its events' class ranks (ascending) and the residuals of its
changed elements (in a non-inverted class, one per event). Integer arithmetic is int64,
which wraps like the format's unsigned arithmetic; comparisons of values that may reach
2^63 go through `_uge`."""

from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec.cuda.entropy import SLOT_ALIGN

RC = 5
ESCAPE = 255


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


def _uge(x: torch.Tensor, k: int) -> torch.Tensor:
    """x >= k for x read as an unsigned 64-bit integer."""
    return (x >= k) | (x < 0)


def zigzag(r: torch.Tensor, bits: int) -> torch.Tensor:
    """+1 -> 0, -1 -> 1, +2 -> 2, ... of residuals r != 0 of width `bits`."""
    wmask = -1 if bits == 64 else (1 << bits) - 1
    neg = ((r >> (bits - 1)) & 1) != 0
    return torch.where(neg, (wmask - r) * 2 + 1, (r - 1) * 2)


def _excl(x: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum with one extra trailing total (int64, length n + 1)."""
    out = torch.zeros(x.numel() + 1, dtype=torch.int64, device=x.device)
    torch.cumsum(x, 0, out=out[1:])
    return out


def _seg_ids(counts: torch.Tensor, total: int) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts,
                                   output_size=total)


class _Events:
    """Per event: symbol byte, extra-bit count and value, segment, index in the segment."""

    def __init__(self, ranks: torch.Tensor, res: torch.Tensor, seg: Segments, dev):
        cnt = torch.as_tensor(seg.ev_cnt, device=dev)
        self.start = _excl(cnt)
        self.seg = _seg_ids(cnt, ranks.numel())
        self.local = torch.arange(ranks.numel(), device=dev) - self.start[self.seg]
        rk = ranks.long()
        prev = torch.cat([rk.new_full((1,), -1), rk[:-1]])
        v = rk - torch.where(self.local == 0, -1, prev)
        nb = (torch.frexp(v.double()).exponent - 1).long()
        self.ne = (nb - 1).clamp_min(0)
        odd = (v >> self.ne) & 1
        bucket = torch.where(v == 1, 0, 2 * nb - 1 + odd)
        self.extra = v & ((1 << self.ne) - 1)
        inv = torch.as_tensor(seg.inverted, device=dev)[self.seg]
        rstart = _excl(torch.as_tensor(seg.res_cnt, device=dev))[self.seg]
        ridx = (rstart + self.local).clamp(max=max(res.numel() - 1, 0))
        zz = zigzag(res[ridx], seg.bits) if res.numel() else torch.zeros_like(v)
        rc = torch.where(inv | ~_uge(zz, RC - 1), torch.where(inv, 0, zz), RC - 1)
        self.sym = (bucket * RC + rc).to(torch.uint8)
        self.bit_at = _excl(self.ne)


class _Residuals:
    """Per changed element: residual symbol, whether it is written, whether it escapes."""

    def __init__(self, res: torch.Tensor, seg: Segments, dev):
        cnt = torch.as_tensor(seg.res_cnt, device=dev)
        self.start = _excl(cnt)
        self.seg = _seg_ids(cnt, res.numel())
        inv = torch.as_tensor(seg.inverted, device=dev)[self.seg]
        zz = zigzag(res, seg.bits)
        self.flag = inv | _uge(zz, RC - 1)
        sym = torch.where(inv, zz, zz - (RC - 1))
        self.esc = self.flag & _uge(sym, ESCAPE)
        self.sym = torch.where(self.esc, ESCAPE, sym).to(torch.uint8)
        self.res = res
        self.flag_at = _excl(self.flag.long())
        self.esc_at = _excl(self.esc.long())


def _seg_total(at: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Per segment, the sum of a counter whose exclusive prefix is `at`, over [start[s], start[s+1])."""
    return at[start[1:]] - at[start[:-1]]


@dataclass
class SymbolStreams:
    """The four streams of every segment in one device buffer."""
    buffer: torch.Tensor
    """uint8, every stream at its slot."""
    offsets: np.ndarray
    """[segments, 4] int64 slot offsets (SLOT_ALIGN-aligned)."""
    lengths: np.ndarray
    """[segments, 4] int64 stream lengths."""
    changed: np.ndarray
    """Changed elements of each segment (int64, host)."""


def _lengths(ev: _Events, rs: _Residuals, seg: Segments) -> tuple[np.ndarray, np.ndarray]:
    """([segments, 4] stream lengths, changes per segment), fetched in one transfer (the one
    sync of this step)."""
    bits = _seg_total(ev.bit_at, ev.start)
    cols = torch.stack([ev.start[1:] - ev.start[:-1], (bits + 7) // 8, _seg_total(rs.flag_at, rs.start),
                        _seg_total(rs.esc_at, rs.start) * (seg.bits // 8), rs.start[1:] - rs.start[:-1]])
    host = cols.cpu().numpy()
    return np.ascontiguousarray(host[:4].T), host[4]


def _write_bits(words: torch.Tensor, ev: _Events, slot_bytes: torch.Tensor) -> None:
    """OR every event's extra bits into little-endian 64-bit words (the bit ranges are
    disjoint, so an integer add is the OR)."""
    at = slot_bytes[ev.seg] * 8 + ev.bit_at[:-1] - ev.bit_at[ev.start[ev.seg]]
    w, sh = at >> 6, at & 63
    words.index_add_(0, w, ev.extra << sh)
    words.index_add_(0, w + 1, (ev.extra >> 1) >> (63 - sh))


def _write(buf: torch.Tensor, ev: _Events, rs: _Residuals, off: torch.Tensor, nbytes: int) -> None:
    buf[off[ev.seg, 0] + ev.local] = ev.sym
    _write_bits(buf.view(torch.int64), ev, off[:, 1])
    f = rs.flag
    seg = rs.seg[f]
    local = rs.flag_at[:-1][f] - rs.flag_at[rs.start[seg]]
    buf[off[seg, 2] + local] = rs.sym[f]
    e = rs.esc
    seg = rs.seg[e]
    first = off[seg, 3] + (rs.esc_at[:-1][e] - rs.esc_at[rs.start[seg]]) * nbytes
    raw = rs.res[e]
    for b in range(nbytes):
        buf[first + b] = ((raw >> (8 * b)) & 0xFF).to(torch.uint8)


def encode(ranks: torch.Tensor, res: torch.Tensor, seg: Segments) -> SymbolStreams:
    """The streams of all segments from their concatenated event ranks (int32) and
    residuals (int64, the element's residual in its low `seg.bits` bits)."""
    dev = ranks.device
    assert ranks.dtype == torch.int32 and res.dtype == torch.int64
    ev, rs = _Events(ranks, res, seg, dev), _Residuals(res, seg, dev)
    lengths, changed = _lengths(ev, rs, seg)
    assert ranks.numel() == int(lengths[:, 0].sum()) and res.numel() == int(changed.sum())
    slots = -(-lengths // SLOT_ALIGN) * SLOT_ALIGN
    offsets = np.concatenate([[0], np.cumsum(slots.ravel())[:-1]]).astype(np.int64).reshape(slots.shape)
    buf = torch.zeros(int(slots.sum()) + 2 * SLOT_ALIGN, dtype=torch.uint8, device=dev)
    _write(buf, ev, rs, torch.from_numpy(offsets).to(dev), seg.bits // 8)
    return SymbolStreams(buf, offsets, lengths, changed)
