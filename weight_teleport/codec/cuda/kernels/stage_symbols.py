"""The inverse symbol step on the GPU, batched over every (chunk, class) segment of a set of
tensors of one element width: event ranks and residuals from the four decoded streams of
docs/FORMAT.md ("Codec sparse"), as the CPU's `symbols_to_class` makes them. The ranks go
straight into the segments' event bitmaps (a bit per class rank); only each segment's last
rank is kept, for the caller's checks.

Nothing synchronises: stream disagreements (a bucket past 44, a gap value past 2^22 (no
chunk holds one), an rc in an inverted class, extra bits, residual symbols or escapes left
over or missing) raise a device flag that the caller reads with its one transfer. Every read
index is clamped into its stream's slot or the buffer, so a malformed pack reads garbage,
never out of bounds.

Per-event arithmetic is 32-bit (the division by the symbol's 5, the prefix sums), which
every value of a valid segment fits (`_segment_kernel` says why): 64-bit integer division is
emulated on the GPU and made the kernel markedly slower. The bitmap's ORs are relaxed
atomics: they only set bits that later kernels read, so they need no ordering, and with
Triton's default (acq_rel) each would be a fence, an atomic that returns and an L1
invalidation."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.kernels.encode_symbols import ESCAPE as _ESCAPE
from weight_teleport.codec.cuda.kernels.encode_symbols import RC as _RC
from weight_teleport.codec.cuda.kernels.encode_symbols import segment, unzigzag

MAX_BUCKET = tl.constexpr(44)
RC = tl.constexpr(_RC)
ESCAPE = tl.constexpr(_ESCAPE)
BLOCK, NUM_WARPS = 512, 4
"""Events (or residuals) a segment's program decodes at once, and its warps: among the
fastest shapes tried (the outputs do not depend on it)."""


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


V_MAX = tl.constexpr(1 << 22)
"""The largest gap value (skipped elements + 1) of a chunk of at most 2^22 elements."""
LEN_CAP = tl.constexpr(1 << 30)
"""Stream lengths are capped here before they index in int32 (a valid stream is far shorter)."""


@triton.jit
def _le_bytes(buf_ptr, at, top, mask, N: tl.constexpr):
    """Little-endian integers of N bytes at `at` (int64; reads clamped into [0, top])."""
    out = tl.zeros(at.shape, tl.int64)
    for b in tl.static_range(N):
        i = tl.minimum(tl.maximum(at + b, 0), top)
        out |= tl.load(buf_ptr + i, mask=mask, other=0).to(tl.int64) << (8 * b)
    return out


@triton.jit
def _capped(n, cap):
    """int32 of the int64 scalar `n` clamped into [0, cap]."""
    return tl.minimum(tl.maximum(n, 0), cap).to(tl.int32)


@triton.jit
def _segment_kernel(
    buf_ptr,
    top,
    off_ptr,
    raw_ptr,
    ev_cnt_ptr,
    ev_start_ptr,
    res_cnt_ptr,
    res_start_ptr,
    inv_ptr,
    seg_word_ptr,
    top_bit,
    bitmap_ptr,
    last_ptr,
    res_ptr,
    bad_ptr,
    BITS: tl.constexpr,
    T: tl.constexpr,
):
    # Per-event arithmetic is int32: within a valid segment ranks stay below 2^22 and a
    # tile's extra bits below 2^15. Stream indices are clamped into their stream's slot
    # (every slot is followed by another slot or the buffer's zero padding, so a read of up
    # to 3 bytes past a stream's end stays in the buffer); the running totals, scalars, are
    # int64 and exact.
    s = tl.program_id(0).to(tl.int64)
    n_ev, ev0, n_res, res0, inv = segment(s, ev_cnt_ptr, ev_start_ptr, res_cnt_ptr, res_start_ptr, inv_ptr)
    bit0 = tl.load(seg_word_ptr + s) * 32
    sym_ptr = buf_ptr + tl.load(off_ptr + s * 4)
    bit_ptr = buf_ptr + tl.load(off_ptr + s * 4 + 1)
    rsym_ptr = buf_ptr + tl.load(off_ptr + s * 4 + 2)
    esc_at = tl.load(off_ptr + s * 4 + 3)
    n_bytes, n_rsym = tl.load(raw_ptr + s * 4 + 1), tl.load(raw_ptr + s * 4 + 2)
    bit_cap, rsym_cap = _capped(n_bytes, LEN_CAP), _capped(n_rsym, LEN_CAP)
    lane = tl.arange(0, T)
    bad = tl.zeros((), tl.int32)
    # stream 1 (symbols, n_ev bytes: the caller has checked its length) and 2 (extra bits)
    # -> class ranks
    bits = tl.zeros((), tl.int64)
    rank = tl.full((), -1, tl.int64)
    t = tl.zeros((), tl.int64)
    while t < n_ev:
        m = lane < n_ev - t
        sym = tl.load(sym_ptr + t + lane, mask=m, other=0).to(tl.int32)
        bucket, rc = sym // RC, sym % RC
        ne = tl.where(bucket > 0, ((bucket + 1) >> 1) - 1, 0)
        bit = (bits & 7).to(tl.int32) + tl.cumsum(ne, 0) - ne
        at = tl.minimum(_capped(bits >> 3, LEN_CAP) + (bit >> 3), bit_cap)
        word = tl.zeros((T,), tl.uint32)
        for b in tl.static_range(4):
            word |= tl.load(bit_ptr + at + b).to(tl.uint32) << (8 * b)
        extra = (word >> (bit & 7).to(tl.uint32)) & ((tl.full((T,), 1, tl.uint32) << ne.to(tl.uint32)) - 1)
        v = tl.where(bucket > 0, ((2 + ((bucket + 1) & 1)) << ne) | extra.to(tl.int32), 1)
        bad |= tl.max((m & ((bucket > MAX_BUCKET) | (inv & (rc != 0)) | (v > V_MAX))).to(tl.int32), 0)
        v = tl.where(m, tl.minimum(v, V_MAX), 0)
        pos = tl.minimum(tl.maximum(bit0 + rank + tl.cumsum(v, 0), 0), top_bit)
        tl.atomic_or(
            bitmap_ptr + (pos >> 5),
            (tl.full((T,), 1, tl.uint32) << (pos & 31).to(tl.uint32)).to(tl.int32, bitcast=True),
            mask=m,
            sem="relaxed",
        )
        bits += tl.sum(tl.where(m, ne, 0), 0)
        rank += tl.sum(v.to(tl.int64), 0)  # exact: an int32 sum of a malformed segment's gaps may wrap
        t += T
    tl.store(last_ptr + s, rank)
    bad |= ((bits + 7) // 8 != n_bytes).to(tl.int32)
    # streams 3 (residual symbols) and 4 (escapes) -> residuals
    NB: tl.constexpr = BITS // 8
    n_sym = tl.zeros((), tl.int64)
    n_esc = tl.zeros((), tl.int64)
    t = tl.zeros((), tl.int64)
    while t < n_res:
        m = lane < n_res - t
        rc = tl.load(sym_ptr + t + lane, mask=m & ~inv, other=0).to(tl.int32) % RC
        rrc = tl.where(inv, RC - 1, rc)
        need = m & (rrc == RC - 1)
        k = tl.minimum(_capped(n_sym, LEN_CAP) + tl.cumsum(need.to(tl.int32), 0) - need.to(tl.int32), rsym_cap)
        sym = tl.load(rsym_ptr + k, mask=need, other=0).to(tl.int32)
        esc = need & (sym == ESCAPE)
        e = n_esc + (tl.cumsum(esc.to(tl.int32), 0) - esc.to(tl.int32)).to(tl.int64)
        z = tl.where(need, sym + tl.where(inv, 0, RC - 1), rrc).to(tl.int64)
        res = tl.where(esc, _le_bytes(buf_ptr, esc_at + e * NB, top, esc, NB), unzigzag(z, BITS))
        tl.store(res_ptr + res0 + t + lane, res, mask=m)
        n_sym += tl.sum(need.to(tl.int32), 0)
        n_esc += tl.sum(esc.to(tl.int32), 0)
        t += T
    bad |= ((n_sym != n_rsym) | (n_esc * NB != tl.load(raw_ptr + s * 4 + 3))).to(tl.int32)
    tl.store(bad_ptr + s, bad.to(tl.int8))


def decode(
    buf: torch.Tensor,
    off: torch.Tensor,
    raw: torch.Tensor,
    ev_cnt: torch.Tensor,
    res_cnt: torch.Tensor,
    inverted: torch.Tensor,
    seg_word: torch.Tensor,
    bitmap: torch.Tensor,
    n_res: int,
    bits: int,
) -> Decoded:
    """Event bitmaps and residuals of every segment, one program per segment walking its
    streams. Per segment (device tensors): `off`/`raw` [S, 4] slot offsets and raw lengths
    of its streams in `buf`, its events, its changed elements (events, or residual symbols
    in an inverted class), whether it is inverted and its first word in `bitmap` (the
    segments' int32 words, zeroed by the caller). A rank past its segment (a malformed
    stream, or weights other than the encoder's: the caller compares `last_rank` with the
    class counts) sets a bit of a later segment, or the last bit; distinct ranks of a
    segment set distinct bits."""
    memory.require(buf, torch.uint8)
    memory.require(bitmap, torch.int32)
    dev, n_seg = buf.device, ev_cnt.numel()
    last = torch.full((max(n_seg, 1),), -1, dtype=torch.int64, device=dev)
    res = torch.empty(n_res, dtype=torch.int64, device=dev)
    bad = torch.zeros(max(n_seg, 1), dtype=torch.int8, device=dev)
    if n_seg:
        _segment_kernel[(n_seg,)](
            buf,
            buf.numel() - 1,
            off.contiguous(),
            raw.contiguous(),
            ev_cnt,
            memory.starts(ev_cnt),
            res_cnt,
            memory.starts(res_cnt),
            inverted.to(torch.int8),
            seg_word,
            bitmap.numel() * 32 - 1,
            bitmap,
            last,
            res,
            bad,
            BITS=bits,
            T=BLOCK,
            num_warps=NUM_WARPS,
        )
    return Decoded(bitmap, last[:n_seg], res, (bad != 0).any())
