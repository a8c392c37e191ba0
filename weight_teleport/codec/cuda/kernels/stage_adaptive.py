"""The range decoder of codec `sparse_ac` on the GPU: a program per chunk walks its coded
stream (docs/FORMAT.md, "Codec `sparse_ac`"), bit for bit as the CPU's
`codec/cpu/adaptive.py` (both on codec/sparse_ac.py's constants), and writes what
`stage_symbols.decode` writes for a `sparse` chunk: each event's class rank as a bit of its
(chunk, class) segment's bitmap, each segment's last rank, and the residuals, segments in
order.

A chunk's stream is sequential, so a program is one scalar walk; its contexts live in a
register vector of one warp (read by a masked sum, written by a select): in registers they
need no ordering between the warp's threads, as a table in memory would. Every read of the
pack is masked to the chunk's stream (reads past its end are the zeros the format pads
with), every write clamped into its output, and every code no encoder writes raises the
chunk's flag, which the caller reads with its one transfer."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec import sparse_ac as A
from weight_teleport.codec.cuda.kernels.encode_symbols import unzigzag
from weight_teleport.codec.cuda.kernels.stage_symbols import Decoded
from weight_teleport.codec.cuda.runtime import memory

N_CTX = tl.constexpr(A.N_CONTEXTS)
CTX = tl.constexpr(256)
"""The context vector's length: N_CONTEXTS rounded up to a power of two."""
GAP_MANT0 = tl.constexpr(A.GAP_TREE)
GAP_MANT_TOP = tl.constexpr(A.GAP_MANT - 1)
RES_LEN0 = tl.constexpr(A.GAP_TREE + 4 * A.GAP_MANT)
RES_LEN_TOP = tl.constexpr(A.RES_LEN - 1)
RES_MANT0 = tl.constexpr(A.GAP_TREE + 4 * A.GAP_MANT + A.RES_LEN)
TOP = tl.constexpr(A.TOP)
RATE_MAX = tl.constexpr(A.RATE_MAX)
MAX_GAP = tl.constexpr((1 << 22) - 1)
assert A.N_CONTEXTS <= 256 and A.PROB_BITS == 16


@triton.jit
def _normalize(buf_ptr, end, rng, code, pos):
    while rng < TOP:
        b = tl.load(buf_ptr + pos, mask=pos < end, other=0).to(tl.int64)
        rng = rng << 8
        code = ((code << 8) | b) & 0xFFFFFFFF
        pos += 1
    return rng, code, pos


@triton.jit
def probability(ctx, c):
    """p of context `c` (int64): `ctx` holds p + (bits seen << 16) per context."""
    lane = tl.arange(0, CTX)
    return (tl.sum(tl.where(lane == c, ctx, 0), 0) & 0xFFFF).to(tl.int64)


@triton.jit
def adapted(ctx, c, one):
    """`ctx` after context `c` coded a bit (`one`: it was 1), as codec/cpu/adaptive._adapt."""
    lane = tl.arange(0, CTX)
    w = tl.sum(tl.where(lane == c, ctx, 0), 0)
    p = (w & 0xFFFF).to(tl.int64)
    n = w >> 16
    s = (
        1
        + (n >= 1).to(tl.int32)
        + (n >= 3).to(tl.int32)
        + (n >= 7).to(tl.int32)
        + (n >= 15).to(tl.int32)
        + (n >= 31).to(tl.int32)
        + (n >= 63).to(tl.int32)
    )
    s = tl.minimum(s, RATE_MAX).to(tl.int64)
    p = tl.where(one, p - (p >> s), p + ((65536 - p) >> s))
    n = n + (n <= 126).to(tl.int32)
    return tl.where(lane == c, (p + (n.to(tl.int64) << 16)).to(tl.int32), ctx)


@triton.jit
def _bit(buf_ptr, end, ctx, c, rng, code, pos):
    """One adaptive bit of context `c`."""
    bound = (rng >> 16) * probability(ctx, c)
    bit = code >= bound
    code = tl.where(bit, code - bound, code)
    rng = tl.where(bit, rng - bound, bound)
    ctx = adapted(ctx, c, bit)
    rng, code, pos = _normalize(buf_ptr, end, rng, code, pos)
    return bit.to(tl.int64), ctx, rng, code, pos


@triton.jit
def _direct(buf_ptr, end, nbits, rng, code, pos):
    """`nbits` bits at probability 1/2, high bit first."""
    v = tl.zeros((), tl.int64)
    k = tl.zeros((), tl.int64)
    while k < nbits:
        rng = rng >> 1
        b = code >= rng
        code = tl.where(b, code - rng, code)
        v = (v << 1) | b.to(tl.int64)
        rng, code, pos = _normalize(buf_ptr, end, rng, code, pos)
        k += 1
    return v, rng, code, pos


@triton.jit
def _gap(buf_ptr, end, ctx, rng, code, pos):
    node = tl.full((), 1, tl.int64)
    for _ in tl.static_range(5):
        b, ctx, rng, code, pos = _bit(buf_ptr, end, ctx, node, rng, code, pos)
        node = 2 * node + b
    nb = node - 32
    v = tl.full((), 1, tl.int64)
    if nb >= 1:
        base = GAP_MANT0 + 4 * tl.minimum(nb, GAP_MANT_TOP)
        b1, ctx, rng, code, pos = _bit(buf_ptr, end, ctx, base, rng, code, pos)
        v = 2 | b1
        if nb >= 2:
            b2, ctx, rng, code, pos = _bit(buf_ptr, end, ctx, base + 1 + b1, rng, code, pos)
            d, rng, code, pos = _direct(buf_ptr, end, nb - 2, rng, code, pos)
            v = (((v << 1) | b2) << (nb - 2)) | d
    return v - 1, ctx, rng, code, pos


@triton.jit
def _residual(buf_ptr, end, ctx, rng, code, pos, BITS: tl.constexpr):
    """(residual, whether its code is one an encoder writes, ...)."""
    length = tl.zeros((), tl.int64)
    go = tl.full((), 1, tl.int64)
    while (go != 0) & (length < 64):
        go, ctx, rng, code, pos = _bit(buf_ptr, end, ctx, RES_LEN0 + tl.minimum(length, RES_LEN_TOP), rng, code, pos)
        length += go
    z = length  # 0 or 1 for lengths 0 and 1
    if length >= 2:
        b, ctx, rng, code, pos = _bit(buf_ptr, end, ctx, RES_MANT0 + length, rng, code, pos)
        d, rng, code, pos = _direct(buf_ptr, end, length - 2, rng, code, pos)
        z = ((2 | b) << (length - 2)) | d
    if BITS == 64:
        ok = z != -2
    else:
        ok = (length <= BITS) & (z != (1 << BITS) - 2)
    return unzigzag(z, BITS), ok, ctx, rng, code, pos


@triton.jit
def fresh_contexts():
    """Every context at p = 1/2, no bit seen: a class's start."""
    lane = tl.arange(0, CTX)
    return tl.where(lane < N_CTX, 1 << 15, 0).to(tl.int32)


@triton.jit
def _chunk_kernel(
    buf_ptr,
    start_ptr,
    end_ptr,
    ev_ptr,
    res_cnt_ptr,
    res_start_ptr,
    inv_ptr,
    seg_word_ptr,
    top_bit,
    bitmap_ptr,
    last_ptr,
    res_ptr,
    n_res,
    bad_ptr,
    NCP: tl.constexpr,
    BITS: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    pos = tl.load(start_ptr + c)
    end = tl.load(end_ptr + c)
    rng = tl.full((), 0xFFFFFFFF, tl.int64)
    code = tl.zeros((), tl.int64)
    for _ in tl.static_range(4):
        code = (code << 8) | tl.load(buf_ptr + pos, mask=pos < end, other=0).to(tl.int64)
        pos += 1
    bad = code == 0xFFFFFFFF
    for k in range(NCP):
        s = c * NCP + k
        ctx = fresh_contexts()
        n_ev = tl.load(ev_ptr + s)
        n_rs = tl.load(res_cnt_ptr + s)
        r0 = tl.load(res_start_ptr + s)
        inv = tl.load(inv_ptr + s) != 0
        bit0 = tl.load(seg_word_ptr + s) * 32
        rank = tl.full((), -1, tl.int64)
        i = tl.zeros((), tl.int64)
        while i < n_ev:
            g, ctx, rng, code, pos = _gap(buf_ptr, end, ctx, rng, code, pos)
            bad |= g > MAX_GAP
            rank += tl.minimum(g, MAX_GAP) + 1
            at = tl.minimum(tl.maximum(bit0 + rank, 0), top_bit)
            tl.atomic_or(
                bitmap_ptr + (at >> 5),
                (tl.full((), 1, tl.uint32) << (at & 31).to(tl.uint32)).to(tl.int32, bitcast=True),
                sem="relaxed",
            )
            if not inv:
                r, ok, ctx, rng, code, pos = _residual(buf_ptr, end, ctx, rng, code, pos, BITS)
                bad |= ~ok
                tl.store(res_ptr + tl.minimum(r0 + i, n_res - 1), r, mask=n_res > 0)
            i += 1
        tl.store(last_ptr + s, rank)
        if inv:
            j = tl.zeros((), tl.int64)
            while j < n_rs:
                r, ok, ctx, rng, code, pos = _residual(buf_ptr, end, ctx, rng, code, pos, BITS)
                bad |= ~ok
                tl.store(res_ptr + tl.minimum(r0 + j, n_res - 1), r, mask=n_res > 0)
                j += 1
    bad |= pos < end
    tl.store(bad_ptr + c, bad.to(tl.int8))


def decode(
    buf: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    ev_cnt: torch.Tensor,
    res_cnt: torch.Tensor,
    inverted: torch.Tensor,
    seg_word: torch.Tensor,
    bitmap: torch.Tensor,
    n_res: int,
    bits: int,
    ncp: int,
) -> Decoded:
    """Event bitmaps and residuals of every (chunk, class) segment of `sparse_ac` chunks, a
    program per chunk. `buf`: the pack's bytes on the device, chunk c's coded stream at
    [starts[c], ends[c]); per segment (chunk c's classes at c * ncp ...): its events, its
    changes, whether its class is inverted and its first word in `bitmap` (zeroed by the
    caller). As `stage_symbols.decode`, a rank past its segment sets a bit of a later one or
    the last bit, for the caller's checks against the class counts."""
    memory.require(buf, torch.uint8)
    memory.require(bitmap, torch.int32)
    dev, n_chunks = buf.device, starts.numel()
    n_seg = ev_cnt.numel()
    assert n_seg == n_chunks * ncp
    last = torch.full((max(n_seg, 1),), -1, dtype=torch.int64, device=dev)
    res = torch.empty(max(n_res, 1), dtype=torch.int64, device=dev)
    bad = torch.zeros(max(n_chunks, 1), dtype=torch.int8, device=dev)
    if n_chunks:
        _chunk_kernel[(n_chunks,)](
            buf,
            starts,
            ends,
            ev_cnt,
            res_cnt,
            memory.starts(res_cnt),
            inverted.to(torch.int8),
            seg_word,
            bitmap.numel() * 32 - 1,
            bitmap,
            last,
            res,
            n_res,
            bad,
            NCP=ncp,
            BITS=bits,
            num_warps=1,
        )
    return Decoded(bitmap, last[:n_seg], res[:n_res], (bad != 0).any())
