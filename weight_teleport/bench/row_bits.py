"""What the row and the column could add to the exponent context, in adaptive code lengths.

A sibling of `bits.context_costs` (same Krichevsky-Trofimov estimators, reset per tensor,
elements in row-major order) whose contexts use only what a receiver has: the old weights
(their exponent `key`), the tensor's shape, the previous version's change, and the elements
of this version decoded before the current one. A tensor is read as rows of its last
dimension (a matrix's row is an output channel, its column an input feature).

Rate contexts compare a count of changes with what the exponent model expected there, as a
bucket of ``log2((changes + 1) / (expected + 1))`` rounded and clipped to +-`HALF_BINS`
(one bucket per factor of two, the middle one meaning "as expected"):

* ``rowprev`` / ``colprev``: the row's (column's) changes in the previous version against
  the previous version's per-key change rates; known before decoding starts.
* ``rowrate``: the changes so far in this row of this version against the sum of the
  adaptive key model's probabilities over them.
* ``colrate``: the same for the column, over the rows decoded above.

``mix`` mixes the models' predictions in the logistic domain with online-learned weights
(as PAQ's mixers do), an upper reference for combining them; a format would need it in
fixed point to decode identically on CPU and GPU.
"""

import math

import numpy as np
from numba import njit

from weight_teleport.bench.bits import _RES_ALPHABET, _keys_and_moves, _kt_binary, _kt_symbols

HALF_BINS = 3
_BINS = 2 * HALF_BINS + 1
_MIXED = ("key", "key+prev", "key+rowprev", "key+colprev", "key+rowrate", "key+colrate")
MASK_MODELS = ("key", "key+prev", "key+rowprev", "key+colprev", "key+rowrate", "key+colrate",
               "key+rowprev+colprev", "key+rowprev+rowrate", "key+prev+rowprev+rowrate", "mix")
RES_MODELS = ("key", "key+rowprev", "key+rowrate")


def _buckets(changes: np.ndarray, expected: np.ndarray) -> np.ndarray:
    ratio = np.log2((changes + 1.0) / (expected + 1.0))
    return (np.clip(np.floor(ratio + 0.5), -HALF_BINS, HALF_BINS) + HALF_BINS).astype(np.int64)


@njit(cache=True, nogil=True)
def _running_buckets(key, bits, cols, n_key, half_bins):
    """Per element, the `rowrate` and `colrate` buckets (see the module docstring)."""
    c0 = np.zeros(n_key, np.float64)
    c1 = np.zeros(n_key, np.float64)
    col_changes = np.zeros(cols, np.float64)
    col_expected = np.zeros(cols, np.float64)
    row_b = np.empty(key.size, np.int64)
    col_b = np.empty(key.size, np.int64)
    for r in range(key.size // cols):
        changes = 0.0
        expected = 0.0
        for j in range(cols):
            i = r * cols + j
            k = key[i]
            p = (c1[k] + 0.5) / (c0[k] + c1[k] + 1.0)
            rb = math.floor(math.log2((changes + 1.0) / (expected + 1.0)) + 0.5)
            cb = math.floor(math.log2((col_changes[j] + 1.0) / (col_expected[j] + 1.0)) + 0.5)
            row_b[i] = min(max(rb, -half_bins), half_bins) + half_bins
            col_b[i] = min(max(cb, -half_bins), half_bins) + half_bins
            b = bits[i]
            changes += b
            expected += p
            col_changes[j] += b
            col_expected[j] += p
            if b:
                c1[k] += 1.0
            else:
                c0[k] += 1.0
    return row_b, col_b


@njit(cache=True, nogil=True)
def _mix_binary(ctxs, n_ctx, bits, lr):
    """Code length (bits) of `bits` under a logistic mix of one KT model per row of `ctxs`;
    the mixer starts as the first model alone and learns its weights online."""
    m_count = ctxs.shape[0]
    c0 = np.zeros((m_count, n_ctx), np.float64)
    c1 = np.zeros((m_count, n_ctx), np.float64)
    w = np.zeros(m_count, np.float64)
    w[0] = 1.0
    st = np.empty(m_count, np.float64)
    total = 0.0
    for i in range(bits.size):
        dot = 0.0
        for m in range(m_count):
            c = ctxs[m, i]
            p = (c1[m, c] + 0.5) / (c0[m, c] + c1[m, c] + 1.0)
            st[m] = math.log(p / (1.0 - p))
            dot += w[m] * st[m]
        p = 1.0 / (1.0 + math.exp(-dot))
        p = min(max(p, 1e-9), 1.0 - 1e-9)
        b = bits[i]
        total -= math.log2(p) if b else math.log2(1.0 - p)
        err = b - p
        for m in range(m_count):
            w[m] += lr * err * st[m]
            c = ctxs[m, i]
            if b:
                c1[m, c] += 1.0
            else:
                c0[m, c] += 1.0
    return total


def _prev_buckets(key, prev_move, rows, cols):
    """`rowprev` and `colprev` buckets, per element."""
    changed = (prev_move > 0).astype(np.float64)
    rate = np.bincount(key, weights=changed, minlength=256) / np.maximum(np.bincount(key, minlength=256), 1)
    expected = rate[key].reshape(rows, cols)
    changed = changed.reshape(rows, cols)
    row_b = _buckets(changed.sum(1), expected.sum(1))
    col_b = _buckets(changed.sum(0), expected.sum(0))
    return np.repeat(row_b, cols), np.tile(col_b, rows)


def _contexts(key, prev, changed, rows, cols):
    rowprev, colprev = _prev_buckets(key, prev, rows, cols)
    rowrate, colrate = _running_buckets(key, changed, cols, 256, HALF_BINS)
    return {"key": key, "key+prev": key * 3 + prev, "key+rowprev": key * _BINS + rowprev,
            "key+colprev": key * _BINS + colprev, "key+rowrate": key * _BINS + rowrate,
            "key+colrate": key * _BINS + colrate,
            "key+rowprev+colprev": (key * _BINS + rowprev) * _BINS + colprev,
            "key+rowprev+rowrate": (key * _BINS + rowprev) * _BINS + rowrate,
            "key+prev+rowprev+rowrate": ((key * 3 + prev) * _BINS + rowprev) * _BINS + rowrate}


def structure_costs(prev_old, old, new, mix_lr: float = 0.02) -> dict[str, float]:
    """Adaptive code lengths in bits of the change old -> new, summed over tensors, per
    model ("mask:<context>", "res:<context>"); `prev_old` -> `old` is the previous change
    (None: no previous version, the previous-version contexts then see no change)."""
    costs = {f"mask:{m}": 0.0 for m in MASK_MODELS} | {f"res:{m}": 0.0 for m in RES_MODELS}
    for name, t in old.items():
        if t.element_size() != 2 or not t.is_floating_point():
            continue
        key, move, d = _keys_and_moves(t, new[name])
        prev = _keys_and_moves(prev_old[name], t)[1] if prev_old is not None else np.zeros_like(move)
        cols = t.shape[-1] if t.dim() > 1 else t.numel()
        changed = (move > 0).astype(np.uint8)
        ctxs = _contexts(key, prev, changed, key.size // cols, cols)
        for m in MASK_MODELS[:-1]:
            costs[f"mask:{m}"] += _kt_binary(ctxs[m], changed, int(ctxs[m].max()) + 1)
        stacked = np.stack([ctxs[m] for m in _MIXED])
        costs["mask:mix"] += _mix_binary(stacked, int(stacked.max()) + 1, changed, mix_lr)
        sel = changed.astype(bool)
        dz = d[sel]
        syms = np.minimum(np.where(dz > 0, 2 * (dz - 1), 2 * (-dz) - 1), _RES_ALPHABET - 1).astype(np.int64)
        for m in RES_MODELS:
            c = ctxs[m][sel]
            costs[f"res:{m}"] += _kt_symbols(c, syms, int(c.max(initial=0)) + 1, _RES_ALPHABET)
    return costs
