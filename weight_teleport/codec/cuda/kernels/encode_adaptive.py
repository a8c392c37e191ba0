"""The range coder of codec `sparse_ac` on the GPU, encoding side: a program per chunk codes
its (chunk, class) segments' events (class ranks, ascending) and residuals into the chunk's
coded stream, byte for byte as the CPU's `codec/cpu/adaptive.encode_classes` (docs/FORMAT.md,
"Codec `sparse_ac`").

As in the decoder (stage_adaptive.py) a chunk is one scalar walk whose contexts live in a
warp's registers. Output goes to the chunk's own room in one buffer; a byte past the room is
counted, not written, so one launch gives every chunk's exact size: the caller launches
again with that room where a chunk did not fit. The zero bytes a stream ends with (which
the format drops) are never read back: the program tracks where its last nonzero byte is."""

import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.kernels.encode_symbols import _residual, _zigzag, segment
from weight_teleport.codec.cuda.kernels.stage_adaptive import (
    GAP_MANT0,
    GAP_MANT_TOP,
    RES_LEN0,
    RES_LEN_TOP,
    RES_MANT0,
    TOP,
    adapted,
    fresh_contexts,
    probability,
)
from weight_teleport.codec.cuda.runtime import memory


@triton.jit
def _emit(out_ptr, room, b, n, last):
    """Byte b at position n of the chunk's stream (written while it fits its room)."""
    tl.store(out_ptr + n, b.to(tl.uint8), mask=n < room)
    last = tl.where(b != 0, n + 1, last)
    return n + 1, last


@triton.jit
def _shift_low(out_ptr, room, low, cache, pending, n, first, last):
    if (low < 0xFF000000) | (low >= 0x100000000):
        carry = low >> 32
        if first != 0:
            first = first * 0
        else:
            n, last = _emit(out_ptr, room, (cache + carry) & 0xFF, n, last)
        k = pending * 0
        while k < pending:
            n, last = _emit(out_ptr, room, (0xFF + carry) & 0xFF, n, last)
            k += 1
        pending = pending * 0
        cache = (low >> 24) & 0xFF
    else:
        pending += 1
    low = (low & 0xFFFFFF) << 8
    return low, cache, pending, n, first, last


@triton.jit
def _normalize(out_ptr, room, low, rng, cache, pending, n, first, last):
    while rng < TOP:
        rng = rng << 8
        low, cache, pending, n, first, last = _shift_low(out_ptr, room, low, cache, pending, n, first, last)
    return low, rng, cache, pending, n, first, last


@triton.jit
def _bit(out_ptr, room, ctx, c, bit, low, rng, cache, pending, n, first, last):
    """Bit `bit` (0 or 1, int64) in context `c`, adapting it."""
    bound = (rng >> 16) * probability(ctx, c)
    one = bit != 0
    low = tl.where(one, low + bound, low)
    rng = tl.where(one, rng - bound, bound)
    ctx = adapted(ctx, c, one)
    low, rng, cache, pending, n, first, last = _normalize(out_ptr, room, low, rng, cache, pending, n, first, last)
    return ctx, low, rng, cache, pending, n, first, last


@triton.jit
def _direct(out_ptr, room, value, nbits, low, rng, cache, pending, n, first, last):
    """The nbits low bits of value, high bit first, at probability 1/2."""
    k = nbits - 1
    while k >= 0:
        rng = rng >> 1
        low = tl.where(((value >> k) & 1) != 0, low + rng, low)
        low, rng, cache, pending, n, first, last = _normalize(out_ptr, room, low, rng, cache, pending, n, first, last)
        k -= 1
    return low, rng, cache, pending, n, first, last


@triton.jit
def _gap(out_ptr, room, ctx, gap, low, rng, cache, pending, n, first, last):
    v = gap + 1
    nb = ((v.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127).to(tl.int64)  # exact: v <= 2^22
    node = tl.full((), 1, tl.int64)
    for k in tl.static_range(4, -1, -1):
        b = (nb >> k) & 1
        ctx, low, rng, cache, pending, n, first, last = _bit(
            out_ptr, room, ctx, node, b, low, rng, cache, pending, n, first, last
        )
        node = 2 * node + b
    if nb >= 1:
        base = GAP_MANT0 + 4 * tl.minimum(nb, GAP_MANT_TOP)
        b1 = (v >> (nb - 1)) & 1
        ctx, low, rng, cache, pending, n, first, last = _bit(
            out_ptr, room, ctx, base, b1, low, rng, cache, pending, n, first, last
        )
        if nb >= 2:
            b2 = (v >> (nb - 2)) & 1
            ctx, low, rng, cache, pending, n, first, last = _bit(
                out_ptr, room, ctx, base + 1 + b1, b2, low, rng, cache, pending, n, first, last
            )
            low, rng, cache, pending, n, first, last = _direct(
                out_ptr, room, v, nb - 2, low, rng, cache, pending, n, first, last
            )
    return ctx, low, rng, cache, pending, n, first, last


@triton.jit
def _zz(out_ptr, room, ctx, z, low, rng, cache, pending, n, first, last):
    """Zigzag residual z (int64 bits): its bit length L in unary, the bit below its leading
    one, the rest direct."""
    length = tl.zeros((), tl.int64)
    while (length < 64) & ((z >> tl.minimum(length, 63)) != 0):
        length += 1
    k = length * 0
    one = tl.full((), 1, tl.int64)
    while k < length:
        ctx, low, rng, cache, pending, n, first, last = _bit(
            out_ptr, room, ctx, RES_LEN0 + tl.minimum(k, RES_LEN_TOP), one, low, rng, cache, pending, n, first, last
        )
        k += 1
    if length < 64:
        ctx, low, rng, cache, pending, n, first, last = _bit(
            out_ptr,
            room,
            ctx,
            RES_LEN0 + tl.minimum(length, RES_LEN_TOP),
            one * 0,
            low,
            rng,
            cache,
            pending,
            n,
            first,
            last,
        )
    if length >= 2:
        ctx, low, rng, cache, pending, n, first, last = _bit(
            out_ptr, room, ctx, RES_MANT0 + length, (z >> (length - 2)) & 1, low, rng, cache, pending, n, first, last
        )
        low, rng, cache, pending, n, first, last = _direct(
            out_ptr, room, z, length - 2, low, rng, cache, pending, n, first, last
        )
    return ctx, low, rng, cache, pending, n, first, last


@triton.jit
def _chunk_kernel(
    ranks_ptr,
    res_ptr,
    ev_ptr,
    ev_start_ptr,
    res_cnt_ptr,
    res_start_ptr,
    inv_ptr,
    out_ptr,
    room_at_ptr,
    room_ptr,
    len_ptr,
    need_ptr,
    NCP: tl.constexpr,
    BITS: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    out = out_ptr + tl.load(room_at_ptr + c)
    room = tl.load(room_ptr + c)
    low = tl.zeros((), tl.int64)
    rng = tl.full((), 0xFFFFFFFF, tl.int64)
    cache = tl.zeros((), tl.int64)
    pending = tl.zeros((), tl.int64)
    n = tl.zeros((), tl.int64)
    first = tl.full((), 1, tl.int64)
    last = tl.zeros((), tl.int64)
    for k in range(NCP):
        s = c * NCP + k
        ctx = fresh_contexts()
        n_ev, e0, n_rs, r0, inv = segment(s, ev_ptr, ev_start_ptr, res_cnt_ptr, res_start_ptr, inv_ptr)
        prev = tl.full((), -1, tl.int64)
        i = tl.zeros((), tl.int64)
        while i < n_ev:
            rank = tl.load(ranks_ptr + e0 + i).to(tl.int64)
            ctx, low, rng, cache, pending, n, first, last = _gap(
                out, room, ctx, rank - prev - 1, low, rng, cache, pending, n, first, last
            )
            prev = rank
            if not inv:
                z = _zigzag(_residual(res_ptr, r0, i, True, 0, BITS), BITS)
                ctx, low, rng, cache, pending, n, first, last = _zz(
                    out, room, ctx, z, low, rng, cache, pending, n, first, last
                )
            i += 1
        if inv:
            j = tl.zeros((), tl.int64)
            while j < n_rs:
                z = _zigzag(_residual(res_ptr, r0, j, True, 0, BITS), BITS)
                ctx, low, rng, cache, pending, n, first, last = _zz(
                    out, room, ctx, z, low, rng, cache, pending, n, first, last
                )
                j += 1
    # the flush: end on the start of the largest aligned block inside [low, low + range)
    keep = tl.full((), 0xFFFFFFFF, tl.int64)
    while (keep > 0) & ((((low + keep) & ~keep) + keep) >= low + rng):
        keep = keep >> 1
    low = (low + keep) & ~keep
    for _ in tl.static_range(5):
        low, cache, pending, n, first, last = _shift_low(out, room, low, cache, pending, n, first, last)
    tl.store(len_ptr + c, last)
    tl.store(need_ptr + c, n)


def encode(
    ranks: torch.Tensor,
    residuals: torch.Tensor,
    ev_cnt: torch.Tensor,
    res_cnt: torch.Tensor,
    inverted: torch.Tensor,
    ncp: int,
    bits: int,
    room: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(buffer, room offsets, coded lengths) of every chunk's stream: chunk c's [chunks * ncp]
    segments' events (`ranks`, int32 class ranks at the starts of `ev_cnt`) and residuals (in
    the elements' width at the starts of `res_cnt`) coded into `room[c]` bytes of the buffer
    at its offset. A chunk whose stream needs more is coded again with the room it needs
    (the host waits for the sizes)."""
    dev, n_chunks = ranks.device, room.numel()
    ev_start, res_start = memory.starts(ev_cnt), memory.starts(res_cnt)
    inv = inverted.to(torch.int8)
    while True:
        at = memory.starts(room)
        buf = torch.empty(max(int(room.sum()), 1), dtype=torch.uint8, device=dev)
        lengths = torch.zeros(max(n_chunks, 1), dtype=torch.int64, device=dev)
        need = torch.zeros_like(lengths)
        if n_chunks:
            _chunk_kernel[(n_chunks,)](
                ranks,
                residuals,
                ev_cnt,
                ev_start,
                res_cnt,
                res_start,
                inv,
                buf,
                at,
                room,
                lengths,
                need,
                NCP=ncp,
                BITS=bits,
                num_warps=1,
            )
        need = need[:n_chunks]
        if bool((need <= room).all()):
            return buf, at, lengths[:n_chunks]
        room = torch.maximum(room, need)
