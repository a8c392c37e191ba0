"""Codec `sparse_ac` on the CPU (docs/FORMAT.md, "Codec `sparse_ac`"): a chunk's encoder
and decoder (`encode_chunk`, `decode_chunk`, codec/registry.py names them), and the numba
kernels of its adaptive binary range coder, which code one chunk's classes of gaps and
residuals into one byte string and back.

The coder is LZMA's binary range coder (32-bit range, carries through a cached byte) with
16-bit probabilities whose adaptation rate starts fast and slows as a context sees more
bits (close to the Krichevsky-Trofimov estimator while a context is young, a 1/128 window
after that): a chunk's classes are short streams, and a fixed slow rate would pay most of
their bits learning. The CUDA backend's kernels (codec/cuda/kernels/encode_adaptive.py,
stage_adaptive.py) mirror the encoder and the decoder here bit for bit."""

import numpy as np
from numba import njit

from weight_teleport.codec.cpu.chunks import chunk_events, place, starts
from weight_teleport.codec.cpu.kernels import unzigzag, zigzag
from weight_teleport.codec.dtypes import DtypeInfo
from weight_teleport.codec.plan import ClassPlan
from weight_teleport.codec.sparse_ac import (
    GAP_MANT,
    GAP_TREE,
    KERNEL,
    N_CONTEXTS,
    PROB_BITS,
    RES_LEN,
    TOP,
    read_tables,
    write_table,
)
from weight_teleport.errors import PackFormatError

U64 = np.uint64
_GAP_MANT0 = GAP_TREE
_RES_LEN0 = _GAP_MANT0 + 4 * GAP_MANT
_RES_MANT0 = _RES_LEN0 + RES_LEN


@njit(inline="always")
def _bit_length(v):
    n = 0
    while v:
        v >>= U64(1)
        n += 1
    return n


@njit(inline="always")
def _adapt(ctxs, ctx, bit):
    """Context `ctx` of `ctxs` (each p + (bits seen << 16)) after coding `bit`."""
    w = ctxs[ctx]
    n = w >> 16
    # s = bit length of (n + 1), at most sparse_ac.RATE_MAX (7): no loop, no table
    s = 1 + (n >= 1) + (n >= 3) + (n >= 7) + (n >= 15) + (n >= 31) + (n >= 63)
    n = n + (n < 127)
    p = w & 0xFFFF
    if bit:
        p -= p >> s
    else:
        p += ((1 << PROB_BITS) - p) >> s
    ctxs[ctx] = p + (n << 16)


# ---- encoder: state is (low, range, cache, pending, out position, first) in `st` ----


@njit(inline="always")
def _shift_low(st, out):
    """LZMA's carry-aware byte output. st = [low, range, cache, pending, n_out, first].
    Returns False when `out` is full."""
    low = st[0]
    if low < U64(0xFF000000) or low >= U64(1 << 32):
        carry = low >> U64(32)
        n = st[4]
        need = st[3] + (U64(0) if st[5] else U64(1))
        if n + need > U64(out.size):
            return False
        if st[5]:
            st[5] = U64(0)  # the first cached byte is always 0: it is not written
        else:
            out[n] = (st[2] + carry) & U64(0xFF)
            n += U64(1)
        for _ in range(st[3]):
            out[n] = (U64(0xFF) + carry) & U64(0xFF)
            n += U64(1)
        st[4] = n
        st[3] = U64(0)
        st[2] = (low >> U64(24)) & U64(0xFF)
    else:
        st[3] += U64(1)
    st[0] = (low & U64(0x00FFFFFF)) << U64(8)
    return True


@njit(inline="always")
def _normalize_enc(st, out):
    ok = True
    while st[1] < U64(TOP):
        st[1] = st[1] << U64(8)
        ok = _shift_low(st, out) and ok
    return ok


@njit(inline="always")
def _enc_bit(st, out, ctxs, ctx, bit):
    bound = (st[1] >> U64(PROB_BITS)) * U64(ctxs[ctx] & 0xFFFF)
    if bit:
        st[0] += bound
        st[1] -= bound
    else:
        st[1] = bound
    _adapt(ctxs, ctx, bit)
    return _normalize_enc(st, out)


@njit(inline="always")
def _enc_direct(st, out, value, nbits):
    """The nbits low bits of value, high bit first, each at probability 1/2."""
    ok = True
    for k in range(nbits - 1, -1, -1):
        st[1] = st[1] >> U64(1)
        if (value >> U64(k)) & U64(1):
            st[0] += st[1]
        ok = _normalize_enc(st, out) and ok
    return ok


@njit(inline="always")
def _enc_gap(st, out, ctxs, gap):
    """v = gap + 1: its bit length minus one (nb, a 5-level tree), the two mantissa bits
    below the leading one (contexts per nb), then the rest at probability 1/2."""
    v = U64(gap) + U64(1)
    nb = _bit_length(v) - 1
    ok = True
    node = 1
    for k in range(4, -1, -1):
        b = (nb >> k) & 1
        ok = _enc_bit(st, out, ctxs, node, b) and ok
        node = 2 * node + b
    if nb >= 1:
        b1 = (v >> U64(nb - 1)) & U64(1)
        base = _GAP_MANT0 + 4 * min(nb, GAP_MANT - 1)
        ok = _enc_bit(st, out, ctxs, base, b1) and ok
        if nb >= 2:
            b2 = (v >> U64(nb - 2)) & U64(1)
            ok = _enc_bit(st, out, ctxs, base + 1 + np.int64(b1), b2) and ok
            ok = _enc_direct(st, out, v, nb - 2) and ok
    return ok


@njit(inline="always")
def _enc_residual(st, out, ctxs, z):
    """Zigzag residual z: its bit length L in unary (contexts per step), the bit below its
    leading one (a context per L), then the rest at probability 1/2."""
    L = _bit_length(z)
    ok = True
    for k in range(L):
        ok = _enc_bit(st, out, ctxs, _RES_LEN0 + min(k, RES_LEN - 1), 1) and ok
    if L < 64:
        ok = _enc_bit(st, out, ctxs, _RES_LEN0 + min(L, RES_LEN - 1), 0) and ok
    if L >= 2:
        ok = _enc_bit(st, out, ctxs, _RES_MANT0 + L, (z >> U64(L - 2)) & U64(1)) and ok
        ok = _enc_direct(st, out, z, L - 2) and ok
    return ok


@njit(inline="always")
def _reset(ctxs):
    for i in range(ctxs.size):
        ctxs[i] = 1 << (PROB_BITS - 1)


@njit(**KERNEL)
def encode_classes(gaps, ev_off, ev_cnt, res, res_off, res_cnt, inverted, signbit_w, wmask, out):
    """Code every class of a chunk, in class order, into `out`: per class, its gaps, each
    followed by its residual in an ordinary class; in an inverted class, the residuals of
    its changes after all its gaps. Contexts restart at every class. Returns the bytes
    written, or -1 when `out` is too small (the caller retries with more room)."""
    ctxs = np.empty(N_CONTEXTS, np.int64)
    st = np.zeros(6, np.uint64)
    st[1] = U64(0xFFFFFFFF)
    st[5] = U64(1)
    ok = True
    for c in range(ev_off.size):
        _reset(ctxs)
        for i in range(ev_cnt[c]):
            ok = _enc_gap(st, out, ctxs, gaps[ev_off[c] + i]) and ok
            if not inverted[c]:
                ok = _enc_residual(st, out, ctxs, zigzag(res[res_off[c] + i], signbit_w, wmask)) and ok
        if inverted[c]:
            for i in range(res_cnt[c]):
                ok = _enc_residual(st, out, ctxs, zigzag(res[res_off[c] + i], signbit_w, wmask)) and ok
        if not ok:
            return -1
    return _flush(st, out)


@njit(inline="always")
def _flush(st, out):
    """End the stream on the start of the largest aligned block (2^k values at a multiple of
    2^k) inside [low, low + range), and drop the zero bytes it ends with: a decoder reads
    zeros past the end, and any value of the interval decodes alike."""
    low, rng = st[0], st[1]
    keep = U64(0xFFFFFFFF)
    while keep and ((low + keep) & ~keep) + keep >= low + rng:
        keep >>= U64(1)
    st[0] = (low + keep) & ~keep
    for _ in range(5):
        if not _shift_low(st, out):
            return -1
    n = np.int64(st[4])
    while n > 0 and out[n - 1] == 0:
        n -= 1
    return n


# ---- decoder: state is (range, code, input position), passed and returned as scalars ----


@njit(inline="always")
def _normalize_dec(data, rng, code, pos):
    while rng < U64(TOP):
        b = U64(data[pos]) if pos < data.size else U64(0)  # zeros past the end
        rng = rng << U64(8)
        code = ((code << U64(8)) | b) & U64(0xFFFFFFFF)
        pos += 1
    return rng, code, pos


@njit(inline="always")
def _dec_bit(data, rng, code, pos, ctxs, ctx):
    bound = (rng >> U64(PROB_BITS)) * U64(ctxs[ctx] & 0xFFFF)
    if code < bound:
        rng = bound
        bit = 0
    else:
        code -= bound
        rng -= bound
        bit = 1
    _adapt(ctxs, ctx, bit)
    rng, code, pos = _normalize_dec(data, rng, code, pos)
    return bit, rng, code, pos


@njit(inline="always")
def _dec_direct(data, rng, code, pos, nbits):
    v = U64(0)
    for _ in range(nbits):
        rng = rng >> U64(1)
        b = U64(0)
        if code >= rng:
            code -= rng
            b = U64(1)
        v = (v << U64(1)) | b
        rng, code, pos = _normalize_dec(data, rng, code, pos)
    return v, rng, code, pos


@njit(inline="always")
def _dec_gap(data, rng, code, pos, ctxs):
    node = 1
    for _ in range(5):
        b, rng, code, pos = _dec_bit(data, rng, code, pos, ctxs, node)
        node = 2 * node + b
    nb = node - GAP_TREE
    if nb == 0:
        return U64(0), rng, code, pos
    base = _GAP_MANT0 + 4 * min(nb, GAP_MANT - 1)
    b1, rng, code, pos = _dec_bit(data, rng, code, pos, ctxs, base)
    v = U64(2 | b1)
    if nb >= 2:
        b2, rng, code, pos = _dec_bit(data, rng, code, pos, ctxs, base + 1 + b1)
        d, rng, code, pos = _dec_direct(data, rng, code, pos, nb - 2)
        v = (((v << U64(1)) | U64(b2)) << U64(nb - 2)) | d
    return v - U64(1), rng, code, pos


@njit(inline="always")
def _dec_residual(data, rng, code, pos, ctxs):
    """(zigzag residual, its bit length, ...)."""
    L = 0
    while L < 64:
        b, rng, code, pos = _dec_bit(data, rng, code, pos, ctxs, _RES_LEN0 + min(L, RES_LEN - 1))
        if b == 0:
            break
        L += 1
    if L < 2:
        return U64(L), L, rng, code, pos
    b, rng, code, pos = _dec_bit(data, rng, code, pos, ctxs, _RES_MANT0 + L)
    d, rng, code, pos = _dec_direct(data, rng, code, pos, L - 2)
    return ((U64(2) | U64(b)) << U64(L - 2)) | d, L, rng, code, pos


@njit(**KERNEL)
def decode_classes(data, ev_off, ev_cnt, res_off, res_cnt, inverted, wmask, gaps, res):
    """Inverse of encode_classes: fills `gaps` and `res` (residuals key(new) - key(old)).
    Returns False when the stream cannot be a coding of these counts: a first word of ones
    (no encoder writes it), a gap of 2^22 or more, a zigzag residual no residual has (wider
    than the element, or 2^bits - 2, which would be a second code of -2^(bits-1)), or bytes
    past the position the decoder reached. Work is bounded by the counts, whatever the bytes."""
    ctxs = np.empty(N_CONTEXTS, np.int64)
    bits = _bit_length(wmask)
    rng, code, pos = U64(0xFFFFFFFF), U64(0), 0
    for _ in range(4):
        b = U64(data[pos]) if pos < data.size else U64(0)
        code = (code << U64(8)) | b
        pos += 1
    if code == U64(0xFFFFFFFF):
        return False
    for c in range(ev_off.size):
        _reset(ctxs)
        joint = not inverted[c]
        for i in range(ev_cnt[c]):
            g, rng, code, pos = _dec_gap(data, rng, code, pos, ctxs)
            if g >= U64(1 << 22):
                return False
            gaps[ev_off[c] + i] = np.int64(g)
            if joint:
                z, L, rng, code, pos = _dec_residual(data, rng, code, pos, ctxs)
                if L > bits or z == wmask - U64(1):
                    return False
                res[res_off[c] + i] = unzigzag(z, wmask)
        if not joint:
            for i in range(res_cnt[c]):
                z, L, rng, code, pos = _dec_residual(data, rng, code, pos, ctxs)
                if L > bits or z == wmask - U64(1):
                    return False
                res[res_off[c] + i] = unzigzag(z, wmask)
    return pos >= data.size


def encode_chunk(old, new, info: DtypeInfo, plan: ClassPlan, total, changed, level: int) -> bytes:
    """A chunk of codec `sparse_ac`: the class table, then one adaptive range-coded stream
    of every class's gaps and residuals (`level`: unused, the chunk has no zstd streams)."""
    events, chg, gaps, res = chunk_events(old, new, info, plan, total, changed)
    wmask = U64((1 << info.bits) - 1)
    room = 64 + 2 * gaps.size + res.size
    while True:
        out = np.empty(room, np.uint8)
        at = write_table(out, 0, plan.n_classes, events, chg, plan.inverted)
        n = encode_classes(
            gaps,
            starts(events),
            events,
            res,
            starts(chg),
            chg,
            plan.inverted,
            U64(1 << (info.bits - 1)),
            wmask,
            out[at:],
        )
        if n >= 0:
            return out[: at + n].tobytes()
        room *= 4


def decode_chunk(old, chunk, info: DtypeInfo, lut: np.ndarray, inverted: np.ndarray):
    """Positions (ascending) and new bit patterns of the changed elements of a `sparse_ac`
    chunk (as `chunks.decode_sparse` for a `sparse` one)."""
    data = np.frombuffer(chunk, np.uint8)
    k = inverted.size
    events, changes, coded = np.zeros((1, k), np.int64), np.zeros((1, k), np.int64), np.zeros(1, np.int64)
    if (
        read_tables(
            data,
            np.zeros(1, np.int64),
            np.array([data.size], np.int64),
            np.array([k], np.int64),
            inverted[None],
            np.array([old.size], np.int64),
            events,
            changes,
            coded,
        )
        >= 0
    ):
        raise PackFormatError(
            "sparse_ac chunk's class table is one its chunk cannot have (truncated, another "
            "class count than its record's, or more events or changes than elements)"
        )
    events, changes = events[0], changes[0]
    gaps = np.empty(int(events.sum()), np.int64)
    res = np.empty(int(changes.sum()), np.uint64)
    wmask = U64((1 << info.bits) - 1)
    if not decode_classes(
        data[coded[0] :], starts(events), events, starts(changes), changes, inverted, wmask, gaps, res
    ):
        raise PackFormatError("sparse_ac chunk's coded stream is malformed")
    return place(old, info, lut, inverted, events, gaps, changes, res)
