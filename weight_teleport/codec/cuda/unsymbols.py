"""The inverse symbol step on the GPU, batched over every (chunk, class) segment of a set of
tensors of one element width: event ranks and residuals from the four decoded streams of
docs/FORMAT.md ("Codec sparse"), as the CPU's `symbols_to_class` makes them. The ranks go
straight into the segments' event bitmaps (a bit per class rank); only each segment's last
rank is kept, for the caller's checks.

Nothing synchronises: stream disagreements (a bucket past 44, an rc in an inverted class,
extra bits, residual symbols or escapes left over or missing) raise a device flag that the
caller reads with its one transfer. Every read index is clamped into the buffer, so a
malformed pack reads garbage, never out of bounds."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda import layout
from weight_teleport.codec.cuda.symbols import ESCAPE as _ESCAPE
from weight_teleport.codec.cuda.symbols import RC as _RC
from weight_teleport.codec.cuda.symbols import segment, unzigzag

MAX_BUCKET = tl.constexpr(44)
RC = tl.constexpr(_RC)
ESCAPE = tl.constexpr(_ESCAPE)
BLOCK = 1024
"""Events (or residuals) a segment's program decodes at once."""


@dataclass
class Decoded:
    bitmap: torch.Tensor
    """int32 words, the bit of each event's class rank set in its segment's words."""
    last_rank: torch.Tensor
    """Class rank of each segment's last event (int64; -1 without events)."""
    residuals: torch.Tensor
    """Residual of every changed element (int64, low `bits` bits), segments in order."""
    malformed: torch.Tensor
    """Device bool."""


@triton.jit
def _le_bytes(buf_ptr, at, top, N: tl.constexpr):
    """Little-endian integers of N bytes at `at` (int64; reads clamped into [0, top])."""
    out = tl.zeros(at.shape, tl.int64)
    for b in tl.static_range(N):
        i = tl.minimum(tl.maximum(at + b, 0), top)
        out |= tl.load(buf_ptr + i).to(tl.int64) << (8 * b)
    return out


@triton.jit
def _segment_kernel(buf_ptr, top, off_ptr, raw_ptr, ev_cnt_ptr, ev_start_ptr, res_cnt_ptr, res_start_ptr, inv_ptr,
                    seg_word_ptr, top_bit, bitmap_ptr, last_ptr, res_ptr, bad_ptr, BITS: tl.constexpr, T: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    n_ev, ev0, n_res, res0, inv = segment(s, ev_cnt_ptr, ev_start_ptr, res_cnt_ptr, res_start_ptr, inv_ptr)
    bit0 = tl.load(seg_word_ptr + s) * 32
    sym_at, bit_at = tl.load(off_ptr + s * 4), tl.load(off_ptr + s * 4 + 1)
    rsym_at, esc_at = tl.load(off_ptr + s * 4 + 2), tl.load(off_ptr + s * 4 + 3)
    bad = tl.zeros((), tl.int32)
    # stream 1 (symbols) and 2 (extra bits) -> class ranks
    bits = tl.zeros((), tl.int64)
    rank = tl.full((), -1, tl.int64)
    t = tl.zeros((), tl.int64)
    while t < n_ev:
        j = t + tl.arange(0, T).to(tl.int64)
        m = j < n_ev
        sym = tl.load(buf_ptr + tl.minimum(sym_at + j, top), mask=m, other=0).to(tl.int64)
        bucket, rc = sym // RC, sym % RC
        bad |= tl.max((m & ((bucket > MAX_BUCKET) | (inv & (rc != 0)))).to(tl.int32), 0)
        ne = tl.where(bucket > 0, ((bucket + 1) >> 1) - 1, 0)
        bit = bits + tl.cumsum(ne, 0) - ne
        word = _le_bytes(buf_ptr, bit_at + (bit >> 3), top, 4)
        extra = (word >> (bit & 7)) & ((tl.full(ne.shape, 1, tl.int64) << ne) - 1)
        v = tl.where(bucket > 0, ((2 + ((bucket + 1) & 1)) << ne) | extra, 1)
        v = tl.where(m, v, 0)
        at = tl.minimum(tl.maximum(bit0 + rank + tl.cumsum(v, 0), 0), top_bit)
        tl.atomic_or(bitmap_ptr + (at >> 5), (tl.full(at.shape, 1, tl.uint32) << (at & 31).to(tl.uint32)).to(
            tl.int32, bitcast=True), mask=m)
        bits += tl.sum(tl.where(m, ne, 0), 0)
        rank += tl.sum(v, 0)
        t += T
    tl.store(last_ptr + s, rank)
    bad |= ((bits + 7) // 8 != tl.load(raw_ptr + s * 4 + 1)).to(tl.int32)
    # streams 3 (residual symbols) and 4 (escapes) -> residuals
    NB: tl.constexpr = BITS // 8
    n_sym = tl.zeros((), tl.int64)
    n_esc = tl.zeros((), tl.int64)
    t = tl.zeros((), tl.int64)
    while t < n_res:
        j = t + tl.arange(0, T).to(tl.int64)
        m = j < n_res
        rc = tl.load(buf_ptr + tl.minimum(sym_at + j, top), mask=m & ~inv, other=0).to(tl.int64) % RC
        rrc = tl.where(inv, RC - 1, rc)
        need = m & (rrc == RC - 1)
        k = n_sym + tl.cumsum(need.to(tl.int64), 0) - need.to(tl.int64)
        sym = tl.load(buf_ptr + tl.minimum(tl.maximum(rsym_at + k, 0), top), mask=need, other=0).to(tl.int64)
        esc = need & (sym == ESCAPE)
        e = n_esc + tl.cumsum(esc.to(tl.int64), 0) - esc.to(tl.int64)
        z = tl.where(need, sym + tl.where(inv, 0, RC - 1), rrc)
        res = tl.where(esc, _le_bytes(buf_ptr, esc_at + e * NB, top, NB), unzigzag(z, BITS))
        tl.store(res_ptr + res0 + j, res, mask=m)
        n_sym += tl.sum(need.to(tl.int64), 0)
        n_esc += tl.sum(esc.to(tl.int64), 0)
        t += T
    bad |= ((n_sym != tl.load(raw_ptr + s * 4 + 2)) | (n_esc * NB != tl.load(raw_ptr + s * 4 + 3))).to(tl.int32)
    tl.store(bad_ptr + s, bad.to(tl.int8))


def decode(buf: torch.Tensor, off: torch.Tensor, raw: torch.Tensor, ev_cnt: torch.Tensor, res_cnt: torch.Tensor,
           inverted: torch.Tensor, seg_word: torch.Tensor, n_words: int, n_res: int, bits: int) -> Decoded:
    """Event bitmaps and residuals of every segment, one program per segment walking its
    streams. Per segment (device tensors): `off`/`raw` [S, 4] slot offsets and raw lengths
    of its streams in `buf`, its events, its changed elements (events, or residual symbols
    in an inverted class), whether it is inverted and its first bitmap word (`seg_word`, of
    `n_words`). A rank past its segment (a malformed stream, or weights other than the
    encoder's: the caller compares `last_rank` with the class counts) sets a bit of a later
    segment, or the last bit; distinct ranks of a segment set distinct bits."""
    layout.require(buf, torch.uint8)
    dev, n_seg = buf.device, ev_cnt.numel()
    bitmap = torch.zeros(max(n_words, 1), dtype=torch.int32, device=dev)
    last = torch.full((max(n_seg, 1),), -1, dtype=torch.int64, device=dev)
    res = torch.empty(n_res, dtype=torch.int64, device=dev)
    bad = torch.zeros(max(n_seg, 1), dtype=torch.int8, device=dev)
    if n_seg:
        _segment_kernel[(n_seg,)](buf, buf.numel() - 1, off.contiguous(), raw.contiguous(), ev_cnt,
                                  layout.starts(ev_cnt), res_cnt, layout.starts(res_cnt), inverted.to(torch.int8),
                                  seg_word, bitmap.numel() * 32 - 1, bitmap, last, res, bad, BITS=bits, T=BLOCK)
    return Decoded(bitmap, last[:n_seg], res, (bad != 0).any())
