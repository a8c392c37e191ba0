"""What the row, the column and the element's history could add to the exponent context.

A sibling of `bits.context_costs`: adaptive code lengths (Krichevsky-Trofimov counts, reset
per tensor, elements in row-major order) of the change mask and of the residuals, whose
contexts use only what a receiver has: the old weights (their exponent `key`), the tensor's
shape, the earlier versions' changes, and the elements of this version decoded before the
current one. A tensor is read as rows of its last dimension (a matrix's row is an output
channel, its column an input feature).

Contexts besides `key`:

* ``prev``: the element's last change (none, up, down); ``hist``: in how many of the
  earlier versions it changed; ``since``: how many versions ago it last changed;
  ``histsign``: the sum of those changes' signs, clipped to +-2.
* ``rowprev`` / ``colprev``: the row's (column's) changes in the last version against what
  that version's per-key change rates predict there; known before decoding starts.
* ``rowrate``: the changes so far in this row of this version against the sum of the
  adaptive key model's probabilities over them; ``colrate``: the same for the column, over
  the rows decoded above.
  Rate contexts are buckets of ``log2((changes + 1) / (expected + 1))``, rounded and clipped
  to +-`HALF_BINS` (one bucket per factor of two; the middle one means "as expected").
* ``row`` / ``col``: the row (column) itself.

A model "A>B" counts per context B but starts each context from A's prediction (B's counts
plus `BACKOFF` pseudo-counts at A's probability), so a rare context costs little to learn.
``mix`` mixes the mask models' predictions in the logistic domain with online-learned
weights (as PAQ's mixers do), a reference for combining them; a format would need it in
fixed point to decode identically on CPU and GPU. ``best`` is, per tensor, the cheapest mask
model plus the bits to name it (an encoder's per-tensor choice).
"""

import math

import numpy as np
from numba import njit

from weight_teleport.bench.bits import _RES_ALPHABET, _keys_and_moves, _kt_binary, _kt_symbols

HALF_BINS = 3
BACKOFF = 8.0
_BINS = 2 * HALF_BINS + 1
MASK_MODELS = (
    "key",
    "key+prev",
    "key+hist",
    "key+hist+since",
    "key+hist>key+hist+since",
    "key+rowprev",
    "key+colprev",
    "key+rowrate",
    "key+colrate",
    "key>key+row",
    "key>key+col",
    "key+hist>key+hist+col",
    "key+hist>key+hist+colprev+rowrate",
)
RES_MODELS = ("key", "key+prev", "key+histsign", "key>key+col", "key+prev>key+prev+col")
_MIXED = ("key", "key+hist", "key+colprev", "key+rowrate", "key+colrate")


def _buckets(changes, expected):
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
def _kt_backoff(parent, child, bits, n_parent, n_child, strength):
    """Code length (bits) of `bits`: KT counts per parent context, and per child context
    counts that start from the parent's probability with `strength` pseudo-counts."""
    p0 = np.zeros(n_parent, np.float64)
    p1 = np.zeros(n_parent, np.float64)
    c0 = np.zeros(n_child, np.float64)
    c1 = np.zeros(n_child, np.float64)
    total = 0.0
    for i in range(bits.size):
        a, c = parent[i], child[i]
        q = (p1[a] + 0.5) / (p0[a] + p1[a] + 1.0)
        p = (c1[c] + strength * q) / (c0[c] + c1[c] + strength)
        if bits[i]:
            total -= math.log2(p)
            p1[a] += 1.0
            c1[c] += 1.0
        else:
            total -= math.log2(1.0 - p)
            p0[a] += 1.0
            c0[c] += 1.0
    return total


@njit(cache=True, nogil=True)
def _kt_symbols_backoff(parent, child, syms, n_parent, n_child, alphabet, strength):
    """`_kt_backoff` for residual symbols (the last symbol is an escape: 16 raw bits)."""
    pc = np.zeros((n_parent, alphabet), np.float64)
    ps = np.zeros(n_parent, np.float64)
    cc = np.zeros((n_child, alphabet), np.float64)
    cs = np.zeros(n_child, np.float64)
    total = 0.0
    for i in range(syms.size):
        a, c, s = parent[i], child[i], syms[i]
        q = (pc[a, s] + 0.5) / (ps[a] + 0.5 * alphabet)
        total -= math.log2((cc[c, s] + strength * q) / (cs[c] + strength))
        pc[a, s] += 1.0
        ps[a] += 1.0
        cc[c, s] += 1.0
        cs[c] += 1.0
        if s == alphabet - 1:
            total += 16.0
    return total


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
        p = min(max(1.0 / (1.0 + math.exp(-dot)), 1e-9), 1.0 - 1e-9)
        b = bits[i]
        total -= math.log2(p) if b else math.log2(1.0 - p)
        for m in range(m_count):
            w[m] += lr * (b - p) * st[m]
            c = ctxs[m, i]
            if b:
                c1[m, c] += 1.0
            else:
                c0[m, c] += 1.0
    return total


def _prev_buckets(key, last_changed, rows, cols):
    """`rowprev` and `colprev` buckets, per element."""
    changed = last_changed.astype(np.float64)
    rate = np.bincount(key, weights=changed, minlength=256) / np.maximum(np.bincount(key, minlength=256), 1)
    expected = rate[key].reshape(rows, cols)
    changed = changed.reshape(rows, cols)
    row_b = _buckets(changed.sum(1), expected.sum(1))
    col_b = _buckets(changed.sum(0), expected.sum(0))
    return np.repeat(row_b, cols), np.tile(col_b, rows)


def _history(earlier, old, name, size):
    """The element's last move (0 none, 1 up, 2 down), its change count, sign sum (clipped
    to +-2, then offset by 2) and the versions since its last change (len(earlier): none)."""
    moves = [_keys_and_moves(a[name], b[name])[1] for a, b in zip(earlier, [*earlier[1:], old])]
    zero = np.zeros(size, np.int64)
    if not moves:
        return zero, zero, zero + 2, zero
    count = sum((m > 0).astype(np.int64) for m in moves)
    signs = sum(np.where(m == 1, 1, np.where(m == 2, -1, 0)) for m in moves)
    since = zero + len(moves)
    for age, m in enumerate(reversed(moves)):
        since = np.where((m > 0) & (since == len(moves)), age, since)
    return moves[-1], count, np.clip(signs, -2, 2) + 2, since


def _contexts(key, earlier, old, name, changed, rows, cols):
    prev, count, signs, since = _history(earlier, old, name, key.size)
    hist = key * (len(earlier) + 1) + count
    rowprev, colprev = _prev_buckets(key, prev > 0, rows, cols)
    rowrate, colrate = _running_buckets(key, changed, cols, 256, HALF_BINS)
    idx = np.arange(key.size)
    return {
        "key": key,
        "key+prev": key * 3 + prev,
        "key+hist": hist,
        "key+histsign": key * 5 + signs,
        "key+rowprev": key * _BINS + rowprev,
        "key+colprev": key * _BINS + colprev,
        "key+rowrate": key * _BINS + rowrate,
        "key+colrate": key * _BINS + colrate,
        "key+row": (idx // cols) * 256 + key,
        "key+col": (idx % cols) * 256 + key,
        "key+prev+col": (key * 3 + prev) * cols + idx % cols,
        "key+hist+col": hist * cols + idx % cols,
        "key+hist+since": hist * (len(earlier) + 1) + since,
        "key+hist+colprev+rowrate": (hist * _BINS + colprev) * _BINS + rowrate,
    }


def _mask_cost(model, ctxs, changed):
    if ">" not in model:
        c = ctxs[model]
        return _kt_binary(c, changed, int(c.max()) + 1)
    a, c = (ctxs[m] for m in model.split(">"))
    return _kt_backoff(a, c, changed, int(a.max()) + 1, int(c.max()) + 1, BACKOFF)


def _res_cost(model, ctxs, sel, syms):
    if ">" not in model:
        c = ctxs[model][sel]
        return _kt_symbols(c, syms, int(c.max(initial=0)) + 1, _RES_ALPHABET)
    a, c = (ctxs[m][sel] for m in model.split(">"))
    return _kt_symbols_backoff(a, c, syms, int(a.max(initial=0)) + 1, int(c.max(initial=0)) + 1, _RES_ALPHABET, BACKOFF)


def structure_costs(earlier, old, new, mix_lr: float = 0.002) -> dict[str, float]:
    """Adaptive code lengths in bits of the change old -> new, summed over tensors, per
    model ("mask:<model>", "res:<model>"); `earlier` are the versions before `old`, oldest
    first (empty: no history, the history contexts then see no change)."""
    costs = {f"mask:{m}": 0.0 for m in (*MASK_MODELS, "mix", "best")} | {f"res:{m}": 0.0 for m in RES_MODELS}
    for name, t in old.items():
        if t.element_size() != 2 or not t.is_floating_point():
            continue
        _, move, d = _keys_and_moves(t, new[name])
        key = _keys_and_moves(t, t)[0]
        cols = t.shape[-1] if t.dim() > 1 else t.numel()
        changed = (move > 0).astype(np.uint8)
        ctxs = _contexts(key, earlier, old, name, changed, key.size // cols, cols)
        mask = {m: _mask_cost(m, ctxs, changed) for m in MASK_MODELS}
        mixed = np.stack([ctxs[m] for m in _MIXED])
        mask["mix"] = _mix_binary(mixed, int(mixed.max()) + 1, changed, mix_lr)
        mask["best"] = min(mask.values()) + math.log2(len(mask))
        for m, v in mask.items():
            costs[f"mask:{m}"] += v
        sel = changed.astype(bool)
        dz = d[sel]
        syms = np.minimum(np.where(dz > 0, 2 * (dz - 1), 2 * (-dz) - 1), _RES_ALPHABET - 1).astype(np.int64)
        for m in RES_MODELS:
            costs[f"res:{m}"] += _res_cost(m, ctxs, sel, syms)
    return costs
