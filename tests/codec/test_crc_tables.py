"""The host-side tables and arithmetic the CUDA C CRC kernel (codec/cuda/kernels/crc.cu) relies on, on
the CPU: its slicing-by-8 tables, and pieces' CRCs moved into place by x^(8 * bytes after
them) and XORed, which must give zlib's CRC of the whole range (the kernel itself runs in the
GPU tests)."""

import zlib

import numpy as np

from weight_teleport.codec.cuda.kernels import crc


def _register(reg: int, data) -> int:
    """The bit-reflected CRC register after `data`, with no inversion before or after."""
    for b in data:
        reg ^= int(b)
        for _ in range(8):
            reg = (reg >> 1) ^ (crc.POLY if reg & 1 else 0)
    return reg


def _shift(n_bytes: int, x2n: list[int]) -> int:
    """x^(8 * n_bytes) modulo the polynomial, as crc.cu computes it (zlib's x2nmodp(n, 3))."""
    p, k = 0x80000000, 3
    while n_bytes:
        if n_bytes & 1:
            p = crc._mulmod_host(x2n[k & 31], p)
        n_bytes >>= 1
        k += 1
    return p


def test_slicing_table_k_is_a_byte_then_k_zero_bytes():
    table, _ = crc._tables()
    tables = crc._slicing(table)
    assert tables.shape == (8, 256)
    for k in range(8):
        assert [int(v) for v in tables[k]] == [_register(0, [b] + [0] * k) for b in range(256)]


def test_pieces_moved_into_place_give_zlibs_crc():
    _, x2n = crc._tables()
    data = np.random.default_rng(0).integers(0, 256, 9000, dtype=np.uint8).tobytes()
    for start, length, piece in (
        (0, 9000, crc.C_PIECE),
        (3, 8000, crc.C_PIECE),
        (1, 4097, 64),
        (5, 17, 16),
        (7, 0, 16),
    ):
        whole = data[start : start + length]
        out = 0
        for lo in range(0, length, piece):
            part = whole[lo : lo + piece]
            out ^= crc._mulmod_host(_shift(length - lo - len(part), x2n.tolist()), zlib.crc32(part))
        assert out == zlib.crc32(whole)
