"""Numba kernels of the CPU backend: one pass each over a chunk, GIL released.

All element arithmetic is done on uint64 so that one kernel serves every width; `wmask`
is the element mask (2^bits - 1) and `signbit` its top bit (0 for integer dtypes, which
then use the identity as their order-preserving key)."""

from typing import Any

import numpy as np
from numba import njit

U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
MIX1 = U64(0xBF58476D1CE4E5B9)
MIX2 = U64(0x94D049BB133111EB)
ESCAPE = 255
RC = 5
"""Residual classes in a joint event symbol: zigzag 0..3 (+1, -1, +2, -2), 4 = look in the
residual stream. Bucket b and class rc make the symbol b * RC + rc (b <= 44, so < 255)."""
MAX_BUCKET = 44
KERNEL: dict[str, Any] = dict(nogil=True, cache=True, boundscheck=False)


@njit(inline="always")
def _mix(z):
    z = (z ^ (z >> U64(30))) * MIX1
    z = (z ^ (z >> U64(27))) * MIX2
    return z ^ (z >> U64(31))


@njit(inline="always")
def _term(word, j):
    return _mix(word ^ (U64(j) * GOLDEN))


@njit(inline="always")
def _key(b, signbit, wmask):
    """Order-preserving map of a float bit pattern to an unsigned integer."""
    if signbit == U64(0):
        return b
    if b & signbit:
        return b ^ wmask
    return b ^ signbit


@njit(inline="always")
def _unkey(k, signbit, wmask):
    if signbit == U64(0):
        return k
    if k & signbit:
        return k ^ signbit
    return k ^ wmask


@njit(inline="always")
def _floor_log2(v):
    n = 0
    for step in (32, 16, 8, 4, 2, 1):
        if v >> U64(step):
            v >>= U64(step)
            n += step
    return n


@njit(**KERNEL)
def digest_words(words, first_word):
    """Sum of the digest terms of `words` (uint64), the first having index `first_word`."""
    s = U64(0)
    for j in range(words.size):
        s += _term(words[j], first_word + j)
    return s


@njit(**KERNEL)
def key_histogram(old, new, shift, kmask, total, changed):
    """Per context key (old value's exponent field): elements and changed elements."""
    for i in range(old.size):
        o = U64(old[i])
        k = (o >> shift) & kmask
        total[k] += 1
        if old[i] != new[i]:
            changed[k] += 1


@njit(**KERNEL)
def sparse_encode(old, new, shift, kmask, lut, inverted, signbit, wmask, ev_off, res_off, gaps, res):
    """Per class, the gaps between events (in that class's own order) and the residuals
    key(new) - key(old) mod 2^bits of changed elements, written at ev_off[c] / res_off[c]."""
    n_cls = lut.max() + 1
    rank = np.zeros(n_cls, np.int64)
    last = np.full(n_cls, -1, np.int64)
    ev_pos = ev_off.copy()
    res_pos = res_off.copy()
    for i in range(old.size):
        o = U64(old[i])
        nw = U64(new[i])
        c = lut[(o >> shift) & kmask]
        ch = o != nw
        if ch:
            res[res_pos[c]] = (_key(nw, signbit, wmask) - _key(o, signbit, wmask)) & wmask
            res_pos[c] += 1
        if ch != inverted[c]:
            gaps[ev_pos[c]] = rank[c] - last[c] - 1
            last[c] = rank[c]
            ev_pos[c] += 1
        rank[c] += 1


@njit(**KERNEL)
def sparse_decode(
    old, shift, kmask, lut, inverted, signbit, wmask, ev_off, ev_cnt, gaps, res_off, res_cnt, res, out_pos, out_val
):
    """Inverse of sparse_encode against the receiver's old chunk: positions and new bit
    patterns of the changed elements, ascending. Returns their number, or -1 when the
    streams do not fit the chunk (a corrupt pack).

    skip[c] counts the class-c elements to pass before the class needs a look: in an
    ordinary class the gap to its next event (NEVER once it has none left), in an inverted
    class always 0, since each of its elements is an event or a change. The common case,
    an unchanged element of an ordinary class, is then one load, one test and one store.
    left[c] is the gap to an inverted class's next event."""
    n_cls = ev_off.size
    never = np.int64(1) << 62
    skip = np.zeros(n_cls, np.int64)
    left = np.full(n_cls, never, np.int64)
    ev_i = np.zeros(n_cls, np.int64)
    res_i = np.zeros(n_cls, np.int64)
    for c in range(n_cls):
        if ev_cnt[c] > 0:
            left[c] = gaps[ev_off[c]]
        if not inverted[c]:
            skip[c] = left[c]
    k = 0
    for i in range(old.size):
        o = U64(old[i])
        c = lut[(o >> shift) & kmask]
        s = skip[c]
        if s != 0:
            skip[c] = s - 1
            continue
        if inverted[c]:
            n_left = left[c]
            if n_left == 0:  # an event of an inverted class: an unchanged element
                e = ev_i[c] + 1
                ev_i[c] = e
                left[c] = gaps[ev_off[c] + e] if e < ev_cnt[c] else never
                continue
            left[c] = n_left - 1
        else:  # an event of an ordinary class: a change
            e = ev_i[c] + 1
            ev_i[c] = e
            skip[c] = gaps[ev_off[c] + e] if e < ev_cnt[c] else never
        r = res_i[c]
        if r >= res_cnt[c]:
            return -1
        res_i[c] = r + 1
        out_pos[k] = i
        out_val[k] = _unkey((_key(o, signbit, wmask) + res[res_off[c] + r]) & wmask, signbit, wmask)
        k += 1
    for c in range(n_cls):
        if ev_i[c] != ev_cnt[c] or res_i[c] != res_cnt[c]:
            return -1
    return k


@njit(inline="always")
def zigzag(r, signbit_w, wmask):
    """Residual r != 0 (w-bit two's complement) as +1 -> 0, -1 -> 1, +2 -> 2, -2 -> 3, ..."""
    if r & signbit_w:
        return (wmask - r) * U64(2) + U64(1)
    return (r - U64(1)) * U64(2)


@njit(inline="always")
def unzigzag(z, wmask):
    if z & U64(1):
        return (wmask - (z >> U64(1))) & wmask
    return (z >> U64(1)) + U64(1)


@njit(inline="always")
def _put_residual(zz, r, rsyms, n_r, escapes, n_esc):
    """Append zz to the residual symbols (ESCAPE and the raw residual when zz >= 255)."""
    if zz < U64(ESCAPE):
        rsyms[n_r] = zz
        return n_esc
    rsyms[n_r] = ESCAPE
    escapes[n_esc] = r
    return n_esc + 1


@njit(**KERNEL)
def class_to_symbols(gaps, res, joint, signbit_w, wmask, syms, bits, rsyms, escapes):
    """Code one class's events and residuals as byte symbols.

    Event gap g is v = g + 1: bucket 0 for v = 1, else 2*nb - 1 + (bit nb-1 of v) with
    nb = floor(log2 v), then the nb - 1 low bits of v go LSB-first to `bits`. The symbol is
    bucket * 4 + rc. With `joint` (events are the changes), rc = min(zigzag residual, 3) and
    only residuals with rc = 3 go to `rsyms` (as zigzag - 3); otherwise rc = 0 and every
    residual goes to `rsyms`. Residual symbols >= 255 are ESCAPE plus the raw residual in
    `escapes`. Returns (bytes of bits, residual symbols, escapes)."""
    acc = U64(0)
    nacc = 0
    nbytes = 0
    n_r = 0
    n_esc = 0
    for i in range(gaps.size):
        v = U64(gaps[i]) + U64(1)
        sym = U64(0)
        if v != U64(1):
            nb = _floor_log2(v)
            sym = U64(2 * nb - 1) + ((v >> U64(nb - 1)) & U64(1))
            ne = nb - 1
            if ne > 0:
                acc |= (v & ((U64(1) << U64(ne)) - U64(1))) << U64(nacc)
                nacc += ne
                while nacc >= 8:
                    bits[nbytes] = acc & U64(0xFF)
                    nbytes += 1
                    acc >>= U64(8)
                    nacc -= 8
        rc = U64(0)
        if joint:
            zz = zigzag(res[i], signbit_w, wmask)
            rc = min(zz, U64(RC - 1))
            if rc == U64(RC - 1):
                n_esc = _put_residual(zz - U64(RC - 1), res[i], rsyms, n_r, escapes, n_esc)
                n_r += 1
        syms[i] = sym * U64(RC) + rc
    if nacc > 0:
        bits[nbytes] = acc & U64(0xFF)
        nbytes += 1
    if not joint:
        for i in range(res.size):
            n_esc = _put_residual(zigzag(res[i], signbit_w, wmask), res[i], rsyms, n_r, escapes, n_esc)
            n_r += 1
    return nbytes, n_r, n_esc


@njit(inline="always")
def _get_residual(s, base, escapes, e, wmask):
    """(residual, escapes used) for residual symbol s; e = -1 when escapes run out."""
    if s != U64(ESCAPE):
        return unzigzag(s + base, wmask), e
    if e >= escapes.size:
        return U64(0), -1
    return escapes[e], e + 1


@njit(**KERNEL)
def symbols_to_class(syms, bits, rsyms, escapes, joint, wmask, gaps, res):
    """Inverse of class_to_symbols (`res` sized to the class's changes). Returns False when
    the streams are malformed or do not agree with each other."""
    acc = U64(0)
    nacc = 0
    pos = 0
    n_r = 0
    e = 0
    for i in range(syms.size):
        s = np.int64(syms[i]) // RC
        rc = U64(np.int64(syms[i]) % RC)
        if s > MAX_BUCKET or (rc != U64(0) and not joint):
            return False
        v = U64(1)
        if s > 0:
            nb = (s + 1) >> 1
            ne = nb - 1
            while nacc < ne:
                if pos >= bits.size:
                    return False
                acc |= U64(bits[pos]) << U64(nacc)
                pos += 1
                nacc += 8
            extra = acc & ((U64(1) << U64(ne)) - U64(1))
            acc = acc >> U64(ne)
            nacc -= ne
            v = (U64(1) << U64(nb)) | (U64((s + 1) & 1) << U64(ne)) | extra
        gaps[i] = v - U64(1)
        if joint:
            if rc < U64(RC - 1):
                res[i] = unzigzag(rc, wmask)
            else:
                if n_r >= rsyms.size:
                    return False
                res[i], e = _get_residual(U64(rsyms[n_r]), U64(RC - 1), escapes, e, wmask)
                n_r += 1
                if e < 0:
                    return False
    if not joint:
        for j in range(rsyms.size):
            res[j], e = _get_residual(U64(rsyms[j]), U64(0), escapes, e, wmask)
            if e < 0:
                return False
        n_r = rsyms.size
    return pos == bits.size and n_r == rsyms.size and e == escapes.size


@njit(**KERNEL)
def residual_all(old, new, signbit, wmask, out):
    """Zigzag of key(new) - key(old) for every element (0 where unchanged)."""
    half = (wmask >> U64(1)) + U64(1)
    for i in range(old.size):
        d = (_key(U64(new[i]), signbit, wmask) - _key(U64(old[i]), signbit, wmask)) & wmask
        out[i] = (d << U64(1)) & wmask if d < half else ((wmask - d) << U64(1)) | U64(1)


@njit(**KERNEL)
def apply_residual_all(old, zz, signbit, wmask, out):
    """Inverse of residual_all."""
    for i in range(old.size):
        z = U64(zz[i])
        d = (wmask - (z >> U64(1))) if z & U64(1) else (z >> U64(1))
        out[i] = _unkey((_key(U64(old[i]), signbit, wmask) + d) & wmask, signbit, wmask)


@njit(**KERNEL)
def digest_patch_delta(words, tail_word, n_full, first_elem, elem_bytes, pos, val, wmask, word_base):
    """Change of the digest sum when elements first_elem + pos[k] of a tensor (whose bytes
    are the uint64 `words`, then `tail_word` at index n_full) take the values val[k].
    `pos` is ascending. Word j of `words` is word j + word_base of the digested bytes (a
    receiver holding a slice of a record's walk)."""
    acc = U64(0)
    k = 0
    # element bytes are a power of two: shifts and masks, since a division by a run-time
    # divisor per change costs more than the two terms
    log_bytes = _floor_log2(U64(elem_bytes))
    log_per_word, log_bits = 3 - log_bytes, 3 + log_bytes
    in_word = (np.int64(1) << log_per_word) - 1
    while k < pos.size:
        j = (first_elem + pos[k]) >> log_per_word
        old_w = words[j] if j < n_full else tail_word
        new_w = old_w
        while k < pos.size and (first_elem + pos[k]) >> log_per_word == j:
            sh = U64(((first_elem + pos[k]) & in_word) << log_bits)
            new_w = (new_w & ~(wmask << sh)) | ((U64(val[k]) & wmask) << sh)
            k += 1
        acc += _term(new_w, j + word_base) - _term(old_w, j + word_base)
    return acc


@njit(**KERNEL)
def scatter(dst, pos, val):
    for k in range(pos.size):
        dst[pos[k]] = val[k]
