"""Bit-level helpers shared by the Triton kernels (device functions only).

Element bit patterns travel as uint64 whatever the dtype's width, as in the CPU kernels."""

import triton
import triton.language as tl

GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
MIX1 = tl.constexpr(0xBF58476D1CE4E5B9)
MIX2 = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def narrow_bits(x, BITS: tl.constexpr):
    """Loaded integers of width BITS as their unsigned bit patterns: uint32 up to 32 bits
    (half the registers and instructions of uint64), uint64 for 64-bit elements. `key`,
    `unkey` and `wrap` work on either."""
    if BITS == 64:
        b = x.to(tl.uint64, bitcast=True)
    else:
        b = x.to(tl.int32).to(tl.uint32, bitcast=True)
        if BITS < 32:
            b = b & ((1 << BITS) - 1)
    return b


@triton.jit
def stored_bits(v, BITS: tl.constexpr):
    """int64 values read from memory (residuals) as `narrow_bits` patterns (mod 2^BITS
    after `wrap`)."""
    if BITS == 64:
        b = v.to(tl.uint64, bitcast=True)
    else:
        b = v.to(tl.uint32)
    return b


@triton.jit
def as_int64(b, BITS: tl.constexpr):
    """`narrow_bits` patterns as int64 (zero-extended below 64 bits) for storing."""
    if BITS == 64:
        v = b.to(tl.int64, bitcast=True)
    else:
        v = b.to(tl.int64)
    return v


@triton.jit
def term(word, j):
    """The digest term of word `word` (uint64) at word index `j` (codec/digest.py)."""
    z = word ^ (j.to(tl.uint64) * GOLDEN)
    z = (z ^ (z >> 30)) * MIX1
    z = (z ^ (z >> 27)) * MIX2
    return z ^ (z >> 31)


@triton.jit
def key(b, IS_FLOAT: tl.constexpr, BITS: tl.constexpr):
    """Order-preserving unsigned key of a bit pattern (the identity for integer dtypes)."""
    if IS_FLOAT:
        sign = 1 << (BITS - 1)
        wmask = (1 << BITS) - 1
        b = tl.where((b & sign) != 0, b ^ wmask, b ^ sign)
    return b


@triton.jit
def unkey(k, IS_FLOAT: tl.constexpr, BITS: tl.constexpr):
    """Inverse of `key`."""
    if IS_FLOAT:
        sign = 1 << (BITS - 1)
        wmask = (1 << BITS) - 1
        k = tl.where((k & sign) != 0, k ^ sign, k ^ wmask)
    return k


@triton.jit
def wrap(v, BITS: tl.constexpr):
    """v mod 2^BITS."""
    if BITS < 64:
        v = v & ((1 << BITS) - 1)
    return v


@triton.jit
def word_terms(b, first, stop, word0, BLOCK: tl.constexpr, BITS: tl.constexpr):
    """Sum of the digest terms of the words formed by the bit patterns `b` of elements
    first .. first + BLOCK - 1 (`first` word-aligned; elements at or past `stop` must be 0
    in `b` and only words starting before `stop` count). `word0` is the index of the word
    of element `first`."""
    PW: tl.constexpr = 64 // BITS
    NW: tl.constexpr = BLOCK // PW
    if PW > 1:
        shifts = (tl.arange(0, PW) * BITS).to(tl.uint64)
        words = tl.sum(tl.reshape(b, (NW, PW)) << shifts[None, :], axis=1)
    else:
        words = b
    w = tl.arange(0, NW)
    t = term(words, word0 + w)
    return tl.sum(tl.where(first + w.to(tl.int64) * PW < stop, t, 0), axis=0)


@triton.jit
def popc32(x):
    """Population count of uint32 lanes."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return (x * 0x01010101) >> 24
