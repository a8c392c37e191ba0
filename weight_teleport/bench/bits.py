"""Where the bits of a delta pack go, against what candidate contexts could reach.

`pack_breakdown` splits a pack's bytes: header, chunk tables, and per stream kind (event
symbols, extra gap bits, residual symbols, escapes) the stored bytes and the order-0
entropy of their raw bytes (the coder's floor for that stream).

`context_costs` gives the code length, in bits, of the change mask and of the residuals
under candidate contexts, each coded adaptively (a Krichevsky-Trofimov estimator per
context, reset per tensor, in element order), so the cost of learning each context's
statistics is included: these are lengths an adaptive arithmetic coder reaches, not
empirical entropies that would need the statistics for free. Contexts: the old value's
exponent (`key`, what the codec's classes group), with the element's previous change
(none, up, down: the receiver saw it), its row, its column, or whether the element before
it changed.
"""

import math

import numpy as np
from numba import njit

from weight_teleport.bench.entropy import bit_view

_RES_ALPHABET = 17
"""Residual symbols: zigzag 0..15, and 16 = escape (then 16 raw bits)."""


@njit(cache=True, nogil=True)
def _kt_binary(ctx, bits, n_ctx):
    """Adaptive code length (bits) of `bits` (uint8 0/1), each under context ctx[i]."""
    c0 = np.zeros(n_ctx, np.float64)
    c1 = np.zeros(n_ctx, np.float64)
    total = 0.0
    for i in range(bits.size):
        c = ctx[i]
        p1 = (c1[c] + 0.5) / (c0[c] + c1[c] + 1.0)
        if bits[i]:
            total -= math.log2(p1)
            c1[c] += 1.0
        else:
            total -= math.log2(1.0 - p1)
            c0[c] += 1.0
    return total


@njit(cache=True, nogil=True)
def _kt_symbols(ctx, syms, n_ctx, alphabet):
    counts = np.zeros((n_ctx, alphabet), np.float64)
    sums = np.zeros(n_ctx, np.float64)
    total = 0.0
    for i in range(syms.size):
        c, s = ctx[i], syms[i]
        total -= math.log2((counts[c, s] + 0.5) / (sums[c] + 0.5 * alphabet))
        counts[c, s] += 1.0
        sums[c] += 1.0
        if s == alphabet - 1:
            total += 16.0
    return total


def _keys_and_moves(old, new):
    """bf16 exponent keys of `old`, and per element 0 unchanged / 1 up / 2 down (key order)."""
    o = bit_view(old).numpy().view(np.uint16)
    n = bit_view(new).numpy().view(np.uint16)
    ko = np.where(o & 0x8000, o ^ 0xFFFF, o ^ 0x8000).astype(np.int64)
    kn = np.where(n & 0x8000, n ^ 0xFFFF, n ^ 0x8000).astype(np.int64)
    d = kn - ko
    move = np.where(d == 0, 0, np.where(d > 0, 1, 2)).astype(np.int64)
    return ((o >> 7) & 0xFF).astype(np.int64), move, d


MASK_MODELS = ("none", "key", "key+prev", "key+row", "key+col", "key+left")
RES_MODELS = ("none", "key", "key+prev")


def context_costs(prev_old, old, new) -> dict[str, float]:
    """Adaptive code lengths in bits of the change old -> new, summed over tensors, per
    model ("mask:<context>", "res:<context>"); `prev_old` -> `old` is the previous change
    (None: no previous version, the "prev" contexts then see none)."""
    costs = {f"mask:{m}": 0.0 for m in MASK_MODELS} | {f"res:{m}": 0.0 for m in RES_MODELS}
    for name, t in old.items():
        if t.element_size() != 2 or not t.is_floating_point():
            continue
        key, move, d = _keys_and_moves(t, new[name])
        prev = _keys_and_moves(prev_old[name], t)[1] if prev_old is not None else np.zeros_like(move)
        cols = t.shape[-1] if t.dim() > 1 else t.numel()
        idx = np.arange(key.size)
        row, col = idx // cols, idx % cols
        changed = (move > 0).astype(np.uint8)
        left = np.concatenate([[0], changed[:-1]]).astype(np.int64)
        ctxs = {
            "none": np.zeros_like(key),
            "key": key,
            "key+prev": key * 3 + prev,
            "key+row": row * 256 + key,
            "key+col": col * 256 + key,
            "key+left": key * 2 + left,
        }
        for m in MASK_MODELS:
            costs[f"mask:{m}"] += _kt_binary(ctxs[m], changed, int(ctxs[m].max()) + 1)
        sel = changed.astype(bool)
        dz = d[sel]
        zz = np.where(dz > 0, 2 * (dz - 1), 2 * (-dz) - 1)
        syms = np.minimum(zz, _RES_ALPHABET - 1).astype(np.int64)
        for m in RES_MODELS:
            c = ctxs[m][sel]
            costs[f"res:{m}"] += _kt_symbols(c, syms, int(c.max(initial=0)) + 1, _RES_ALPHABET)
    return costs


def _h0_bits(raw: np.ndarray) -> float:
    """Order-0 entropy of a byte stream, in bits (the floor of a static byte coder)."""
    if raw.size == 0:
        return 0.0
    counts = np.bincount(raw, minlength=256)
    q = counts[counts > 0] / raw.size
    return float(-(q * np.log2(q)).sum() * raw.size)


STREAM_KINDS = ("event symbols", "extra gap bits", "residual symbols", "escapes")


def pack_breakdown(pack: bytes) -> dict[str, float]:
    """Bytes of a pack by part (see the module docstring); "<kind> h0" are order-0 entropies
    of the streams' raw bytes, in bytes, "<kind> streams" the number of such streams."""
    from weight_teleport.codec.streams import decode_stream
    from weight_teleport.format import chunk_payload, read_groups, read_header

    header = read_header(pack)
    out = {"header": float(header.payload_offset), "chunk tables": 0.0, "dense chunks": 0.0}
    for kind in STREAM_KINDS:
        out |= {kind: 0.0, f"{kind} h0": 0.0, f"{kind} streams": 0.0}
    for rec in header.tensors:
        for ref in rec.chunks:
            data = chunk_payload(pack, header, ref)
            if rec.codec != "sparse":
                out["dense chunks"] += len(data)
                continue
            groups = read_groups(data)
            stored = 0
            for g in groups:
                for kind, s in zip(STREAM_KINDS, g.streams):
                    raw = decode_stream(s.codec, s.data, s.raw_len)
                    out[kind] += len(s.data)
                    out[f"{kind} h0"] += _h0_bits(raw) / 8
                    out[f"{kind} streams"] += 1
                    stored += len(s.data)
            out["chunk tables"] += len(data) - stored
    return out
