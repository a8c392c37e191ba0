"""What both backends share of codec `sparse_ac` (docs/FORMAT.md, "Codec `sparse_ac`"):
the range coder's constants and context layout, which the CPU's coder
(codec/cpu/adaptive.py) and the CUDA kernels (codec/cuda/kernels/encode_adaptive.py,
stage_adaptive.py) both follow, and a chunk's class table, which both write and read on
the host."""

from typing import Any

from numba import njit

from weight_teleport.format.groups import read_varint

KERNEL: dict[str, Any] = dict(nogil=True, cache=True, boundscheck=False)

PROB_BITS = 16
RATE_MAX = 7
"""An adaptive context's rate is 2^-s with s = bit length of (bits seen + 1), at most RATE_MAX."""
TOP = 1 << 24

GAP_TREE = 32
"""Nodes of the gap's bit-length tree (5 levels: bit lengths 0..31; a chunk's gaps need <= 22)."""
GAP_MANT = 23
"""Bit lengths whose first two mantissa bits have contexts (0..22)."""
RES_LEN = 16
"""Contexts of the residual's unary bit length (the last one serves every longer length)."""
RES_MANT = 65
N_CONTEXTS = GAP_TREE + 4 * GAP_MANT + RES_LEN + RES_MANT


# ---- the class table before a chunk's coded stream ----


@njit(inline="always")
def _write_varint(out, at, v):
    while v >= 0x80:
        out[at] = (v & 0x7F) | 0x80
        v >>= 7
        at += 1
    out[at] = v
    return at + 1


@njit(**KERNEL)
def write_table(out, at, n_classes, events, changes, inverted):
    """A chunk's class table at `out[at:]` (K, then each class's events and, for an
    inverted class, its changes); returns the position after it. At most 10 bytes a varint."""
    at = _write_varint(out, at, n_classes)
    for c in range(n_classes):
        at = _write_varint(out, at, events[c])
        if inverted[c]:
            at = _write_varint(out, at, changes[c])
    return at


@njit(**KERNEL)
def read_tables(pack, starts, lengths, n_classes, inverted, elems, events, changes, coded):
    """The class tables of chunks: chunk c at pack[starts[c]:starts[c] + lengths[c]], of
    `n_classes[c]` classes (`inverted` [chunks, >= classes]) and `elems[c]` elements. Fills
    `events` and `changes` [chunks, >= classes] and `coded` (where each coded stream
    starts). Returns the first chunk whose table breaks the format's rules (truncated, K not
    the record's, counts past the chunk's elements), or -1."""
    for c in range(starts.size):
        pos, end = starts[c], starts[c] + lengths[c]
        k, pos = read_varint(pack, pos, end)
        if k != n_classes[c]:
            return c
        ev_sum, ch_sum = 0, 0
        for j in range(k):
            e, pos = read_varint(pack, pos, end)
            ch = e
            if inverted[c, j] and e >= 0:
                ch, pos = read_varint(pack, pos, end)
            if e < 0 or ch < 0:
                return c
            events[c, j], changes[c, j] = e, ch
            ev_sum += e
            ch_sum += ch
        if ev_sum > elems[c] or ch_sum > elems[c]:
            return c
        coded[c] = pos
    return -1
