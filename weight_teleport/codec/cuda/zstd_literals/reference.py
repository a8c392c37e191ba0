"""Zstandard frames of Huffman-coded literals alone (RFC 8878): the reference writer.

A symbol stream of a sparse chunk is cut into blocks of at most 128 KiB. A block whose bytes
are all one value is an RLE block; otherwise it is a compressed block holding only a literals
section (Huffman-coded, one stream below 1024 bytes, else four) and no sequences, or a raw
block where that is not smaller. Any zstd decoder reads these frames, so packs that use them
stay portable; the CUDA backend writes the same bytes on the GPU (codec/cuda/zstd_literals/huffman.cu),
where matching (the costly half of zstd) does not pay on streams with so little repetition.

A tree's weights are written in the direct 4-bit form up to symbol 128, FSE-compressed past
it (zstd's own encoder order, with a normalisation of our own: any valid one decodes); a
block whose weights cannot be written that way (one weight value: uniform bytes) is raw.

Code lengths: Huffman's two-queue construction over the symbols ordered by (count, symbol),
leaves taken before internal nodes on equal counts; lengths over MAX_BITS are cut to it and
the code is made complete again (the Kraft sum exactly 1, which zstd's implied last weight
needs): lengthening the first of the longest codes below MAX_BITS in that order while the sum
is over, then shortening from the most frequent end while under. Every step is deterministic,
so the GPU's bytes equal these."""

import numpy as np

BLOCK_BYTES = 128 << 10
MAX_BITS = 11
MAX_SYMBOL = 128
"""The largest symbol the direct weight form describes (128 weights, the last implied); past
it the weights are FSE-compressed."""
WEIGHT_LOG = 6
"""Accuracy log of the FSE table of compressed weights (zstd's maximum for them)."""
MAGIC = b"\x28\xb5\x2f\xfd"
RAW_BLOCK, RLE_BLOCK, COMPRESSED_BLOCK = 0, 1, 2
ONE_STREAM_BELOW = 1024
SIZE_IN_1_BELOW, SIZE_IN_2_BELOW = 256, 65536 + 256
"""Frames of fewer bytes than these hold their size in 1 or 2 bytes, others in 4."""


def code_lengths(hist: np.ndarray) -> np.ndarray:
    """[256] code lengths (0 for absent symbols) of a histogram with at least two symbols."""
    order = sorted((int(c), s) for s, c in enumerate(hist) if c)
    n = len(order)
    assert n >= 2
    count = [c for c, _ in order] + [0] * (n - 1)
    parent = [0] * (2 * n - 1)
    leaf, inner = 0, n
    for node in range(n, 2 * n - 1):
        pair = []
        for _ in range(2):
            if leaf < n and (inner >= node or count[leaf] <= count[inner]):
                pair.append(leaf)
                leaf += 1
            else:
                pair.append(inner)
                inner += 1
        count[node] = count[pair[0]] + count[pair[1]]
        parent[pair[0]] = parent[pair[1]] = node
    depth = [0] * (2 * n - 1)
    for i in range(2 * n - 3, -1, -1):
        depth[i] = depth[parent[i]] + 1
    length = [min(d, MAX_BITS) for d in depth[:n]]
    kraft = sum(1 << (MAX_BITS - x) for x in length)
    while kraft > 1 << MAX_BITS:
        best = -1
        for i in range(n):
            if length[i] < MAX_BITS and (best < 0 or length[i] > length[best]):
                best = i
        length[best] += 1
        kraft -= 1 << (MAX_BITS - length[best])
    while kraft < 1 << MAX_BITS:
        for i in range(n - 1, -1, -1):
            if length[i] > 1 and 1 << (MAX_BITS - length[i]) <= (1 << MAX_BITS) - kraft:
                kraft += 1 << (MAX_BITS - length[i])
                length[i] -= 1
                break
    out = np.zeros(256, np.int64)
    for (_, s), x in zip(order, length):
        out[s] = x
    return out


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """[256] code values as zstd's decoder assigns them: by weight (MAX + 1 - length)
    ascending, then by symbol, each taking 2^(weight - 1) rows of a 2^MAX row table."""
    top = int(lengths.max())
    codes, row = np.zeros(256, np.int64), 0
    for w in range(1, top + 1):
        for s in np.flatnonzero(lengths == top + 1 - w):
            codes[s] = row >> (w - 1)
            row += 1 << (w - 1)
    return codes


def _bitstream(symbols: np.ndarray, codes: np.ndarray, lengths: np.ndarray) -> bytes:
    """A backward Huffman stream: the last symbol's code first, from bit 0 up, then a 1 bit
    (the end mark), zero-padded to a byte."""
    acc, at = 0, 0
    for s in symbols[::-1]:
        acc |= int(codes[s]) << at
        at += int(lengths[s])
    acc |= 1 << at
    return acc.to_bytes(at // 8 + 1, "little")


def _literals_header(regen: int, size: int) -> bytes:
    """Compressed literals (type 2): one stream with 10-bit sizes below 1024 bytes, else four
    with 14- or 18-bit sizes."""
    if regen < ONE_STREAM_BELOW:
        return (2 | regen << 4 | size << 14).to_bytes(3, "little")
    if regen < 1 << 14:
        return (2 | 2 << 2 | regen << 4 | size << 18).to_bytes(4, "little")
    return (2 | 3 << 2 | regen << 4 | size << 22).to_bytes(5, "little")


def _normalized(weights: np.ndarray) -> np.ndarray:
    """Counts of the weight values scaled to 2^WEIGHT_LOG, each present value at least 1:
    one each, the rest by largest remainder (ties to the smaller value)."""
    count = np.bincount(weights, minlength=MAX_BITS + 1)
    present = np.flatnonzero(count)
    rest = (1 << WEIGHT_LOG) - present.size
    norm = (count > 0).astype(np.int64)
    share = count * rest
    norm += share // weights.size
    left = rest - int((share // weights.size).sum())
    order = sorted(present, key=lambda v: (-(int(share[v]) % weights.size), v))
    for v in order[:left]:
        norm[v] += 1
    return norm


def _fse_weights(weights: np.ndarray) -> bytes | None:
    """The FSE-compressed form of Huffman weights (RFC 8878 4.2.1.2, the encoder of zstd's
    reference order: two interleaved states, the last weight first), or None where it cannot
    be written: a single weight value (no bits to end on), or 128 bytes or more."""
    if np.count_nonzero(np.bincount(weights)) < 2:
        return None
    norm, size = _normalized(weights), 1 << WEIGHT_LOG
    acc, at = 0, 0

    def add(value: int, n: int) -> None:
        nonlocal acc, at
        acc |= (value & ((1 << n) - 1)) << at
        at += n

    # table description: accuracy log - 5, then each value's count + 1 in a variable number
    # of bits; after a zero count, the run of further zero counts in 2-bit repeat codes
    add(WEIGHT_LOG - 5, 4)
    remaining, threshold, nb = size + 1, size, WEIGHT_LOG + 1
    v, after_zero = 0, False
    while remaining > 1:
        if after_zero:
            start = v
            while norm[v] == 0:
                v += 1
            while v >= start + 24:
                start += 24
                add(0xFFFF, 16)
            while v >= start + 3:
                start += 3
                add(3, 2)
            add(v - start, 2)
        count = int(norm[v])
        v += 1
        limit = 2 * threshold - 1 - remaining
        remaining -= count
        count += 1
        if count >= threshold:
            count += limit
        add(count, nb - (count < limit))
        after_zero = count == 1
        while remaining < threshold:
            nb -= 1
            threshold >>= 1
    head = acc.to_bytes((at + 7) // 8, "little")
    # states: symbol spread, then per value its next states and transform
    step, mask = (size >> 1) + (size >> 3) + 3, size - 1
    spread, pos = [0] * size, 0
    for symbol in range(norm.size):
        for _ in range(int(norm[symbol])):
            spread[pos] = symbol
            pos = (pos + step) & mask
    cumul = np.r_[0, np.cumsum(norm)]
    table, nxt = [0] * size, list(cumul[:-1])
    for u in range(size):
        table[nxt[spread[u]]] = size + u
        nxt[spread[u]] += 1
    delta_bits: dict[int, int] = {}
    delta_state: dict[int, int] = {}
    for value in np.flatnonzero(norm).tolist():
        n_v = int(norm[value])
        out_bits = WEIGHT_LOG - (n_v - 1).bit_length() + 1 if n_v > 1 else WEIGHT_LOG
        delta_bits[value] = (out_bits << 16) - (n_v << out_bits) if n_v > 1 else (WEIGHT_LOG << 16) - size
        delta_state[value] = int(cumul[value]) - n_v if n_v > 1 else int(cumul[value]) - 1
    acc, at = 0, 0

    def first(value: int) -> int:
        n = (delta_bits[value] + (1 << 15)) >> 16
        return table[((n << 16) - delta_bits[value] >> n) + delta_state[value]]

    def encode(state: int, value: int) -> int:
        n = (state + delta_bits[value]) >> 16
        add(state, n)
        return table[(state >> n) + delta_state[value]]

    w = [int(x) for x in weights]
    i = len(w)
    if i & 1:
        s1, s2 = first(w[i - 1]), first(w[i - 2])
        s1 = encode(s1, w[i - 3])
        i -= 3
    else:
        s2, s1 = first(w[i - 1]), first(w[i - 2])
        i -= 2
    if i & 2:
        s2, s1 = encode(s2, w[i - 1]), encode(s1, w[i - 2])
        i -= 2
    while i > 0:
        s2 = encode(s2, w[i - 1])
        s1 = encode(s1, w[i - 2])
        s2 = encode(s2, w[i - 3])
        s1 = encode(s1, w[i - 4])
        i -= 4
    add(s2, WEIGHT_LOG)
    add(s1, WEIGHT_LOG)
    add(1, 1)
    body = head + acc.to_bytes((at + 7) // 8, "little")
    return body if len(body) < 128 else None


def _tree(lengths: np.ndarray, last: int) -> bytes | None:
    """The Huffman tree description: weights of the symbols below `last`, direct (4 bits
    each) up to 128 of them, else FSE-compressed; None where neither can be written."""
    top = int(lengths.max())
    weights = np.where(lengths[:last] > 0, top + 1 - lengths[:last], 0)
    if last <= MAX_SYMBOL:
        return bytes([127 + last]) + bytes(
            int(weights[k]) << 4 | int(weights[k + 1] if k + 1 < last else 0) for k in range(0, last, 2)
        )
    fse = _fse_weights(weights)
    return None if fse is None else bytes([len(fse)]) + fse


def _huffman_block(data: np.ndarray, hist: np.ndarray) -> bytes | None:
    """A compressed block's content (the literals section, then no sequences), or None
    where its tree cannot be described or it is no smaller than the raw block."""
    lengths = code_lengths(hist)
    codes = canonical_codes(lengths)
    tree = _tree(lengths, int(np.flatnonzero(hist).max()))
    if tree is None:
        return None
    if data.size < ONE_STREAM_BELOW:
        body = _bitstream(data, codes, lengths)
    else:
        quarter = (data.size + 3) // 4
        streams = [_bitstream(data[k * quarter : (k + 1) * quarter], codes, lengths) for k in range(4)]
        body = b"".join(len(s).to_bytes(2, "little") for s in streams[:3]) + b"".join(streams)
    head = 3 if data.size < ONE_STREAM_BELOW else 4 if data.size < 1 << 14 else 5
    if head + len(tree) + len(body) + 1 >= data.size:
        return None  # no smaller than the raw block
    return _literals_header(data.size, len(tree) + len(body)) + tree + body + b"\0"


def frame_header(n: int) -> bytes:
    """Magic and a single-segment frame header holding the content size `n` in 1, 2 (n - 256)
    or 4 bytes."""
    if n < SIZE_IN_1_BELOW:
        return MAGIC + bytes([0x20, n])
    if n < SIZE_IN_2_BELOW:
        return MAGIC + bytes([0x60]) + (n - 256).to_bytes(2, "little")
    return MAGIC + bytes([0xA0]) + n.to_bytes(4, "little")


def frame_header_size(n):
    """Bytes of `frame_header(n)`, of an int or each of an array (numpy or torch, where the
    GPU writer lays its frames out)."""
    return 6 + (n >= SIZE_IN_1_BELOW) + 2 * (n >= SIZE_IN_2_BELOW)


def frame(data) -> bytes:
    """The frame of `data` (at least one byte)."""
    data = np.frombuffer(bytes(data), np.uint8)
    assert data.size
    out = [frame_header(data.size)]
    for at in range(0, data.size, BLOCK_BYTES):
        block = data[at : at + BLOCK_BYTES]
        last = int(at + BLOCK_BYTES >= data.size)
        hist = np.bincount(block, minlength=256)
        if np.count_nonzero(hist) == 1:
            kind, content, size = RLE_BLOCK, bytes(block[:1]), block.size
        else:
            coded = _huffman_block(block, hist)
            kind, size = (COMPRESSED_BLOCK, len(coded)) if coded else (RAW_BLOCK, block.size)
            content = coded or block.tobytes()
        out += [(last | kind << 1 | size << 3).to_bytes(3, "little"), content]
    return b"".join(out)
