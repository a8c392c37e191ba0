"""The tensor digest: 64 bits over a tensor's bytes, the same on CPU and GPU.

Bytes are read as little-endian 64-bit words w_j (the last one zero-padded). With
mix = the SplitMix64 finalizer and all arithmetic mod 2^64:

    S = sum_j mix(w_j XOR (j * 0x9E3779B97F4A7C15))
    digest = S + nbytes * 0xD6E8FEB86659FD93

A sum of independent word terms is order-free to compute (one parallel reduction on a
GPU) and can be updated from the changed words alone: S' = S + sum (mix(new) - mix(old)).
It detects corruption and mistakes, not adversaries.
"""

LENGTH_MULT = 0xD6E8FEB86659FD93
MASK64 = (1 << 64) - 1


def finish(word_sum: int, nbytes: int) -> int:
    """The digest from the sum of word terms and the byte length."""
    return (word_sum + nbytes * LENGTH_MULT) & MASK64


def word_sum(digest: int, nbytes: int) -> int:
    """Inverse of finish: the sum of word terms a digest stands for."""
    return (digest - nbytes * LENGTH_MULT) & MASK64


def to_hex(digest: int) -> str:
    return f"{digest:016x}"


def from_hex(text: str) -> int:
    return int(text, 16)
