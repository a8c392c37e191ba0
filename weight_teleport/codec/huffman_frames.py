"""Zstandard frames of Huffman-coded literals alone (RFC 8878): the reference writer.

A symbol stream of a sparse chunk is cut into blocks of at most 128 KiB. A block whose bytes
are all one value is an RLE block; otherwise it is a compressed block holding only a literals
section (Huffman-coded, one stream below 1024 bytes, else four) and no sequences, or a raw
block where that is not smaller. Any zstd decoder reads these frames, so packs that use them
stay portable; the CUDA backend writes the same bytes on the GPU (codec/cuda/huffman.cu),
where matching (the costly half of zstd) does not pay on streams with so little repetition.

Huffman weights are written in the direct 4-bit form, which describes alphabets up to symbol
128; `frame` returns None for a stream with a larger symbol (the caller codes it otherwise).

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
"""The largest symbol the direct weight form describes (128 weights, the last implied)."""
MAGIC = b"\x28\xb5\x2f\xfd"
RAW_BLOCK, RLE_BLOCK, COMPRESSED_BLOCK = 0, 1, 2
ONE_STREAM_BELOW = 1024


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


def _huffman_block(data: np.ndarray, hist: np.ndarray) -> bytes:
    """A compressed block's content: the literals section, then no sequences."""
    lengths = code_lengths(hist)
    codes = canonical_codes(lengths)
    top, last = int(lengths.max()), int(np.flatnonzero(hist).max())
    weights = np.where(lengths[:last] > 0, top + 1 - lengths[:last], 0)
    tree = bytes([127 + last]) + bytes(int(weights[k]) << 4 | int(weights[k + 1] if k + 1 < last else 0)
                                       for k in range(0, last, 2))
    if data.size < ONE_STREAM_BELOW:
        body = _bitstream(data, codes, lengths)
    else:
        quarter = (data.size + 3) // 4
        streams = [_bitstream(data[k * quarter:(k + 1) * quarter], codes, lengths) for k in range(4)]
        body = b"".join(len(s).to_bytes(2, "little") for s in streams[:3]) + b"".join(streams)
    return _literals_header(data.size, len(tree) + len(body)) + tree + body + b"\0"


def frame_header(n: int) -> bytes:
    """Magic and a single-segment frame header holding the content size `n`."""
    if n < 256:
        return MAGIC + bytes([0x20, n])
    if n < 65536 + 256:
        return MAGIC + bytes([0x60]) + (n - 256).to_bytes(2, "little")
    return MAGIC + bytes([0xA0]) + n.to_bytes(4, "little")


def frame(data) -> bytes | None:
    """The frame of `data` (at least one byte), or None when a byte exceeds MAX_SYMBOL."""
    data = np.frombuffer(bytes(data), np.uint8)
    assert data.size
    if int(data.max()) > MAX_SYMBOL:
        return None
    out = [frame_header(data.size)]
    for at in range(0, data.size, BLOCK_BYTES):
        block = data[at:at + BLOCK_BYTES]
        last = int(at + BLOCK_BYTES >= data.size)
        hist = np.bincount(block, minlength=256)
        if np.count_nonzero(hist) == 1:
            kind, content, size = RLE_BLOCK, bytes(block[:1]), block.size
        else:
            content = _huffman_block(block, hist)
            kind, size = COMPRESSED_BLOCK, len(content)
            if size >= block.size:
                kind, content, size = RAW_BLOCK, block.tobytes(), block.size
        out += [(last | kind << 1 | size << 3).to_bytes(3, "little"), content]
    return b"".join(out)
