"""Shared test helpers: bit-pattern comparison, state generators, corrupted packs."""

import zlib

import numpy as np
import torch

from weight_teleport.codec.dtypes import BY_NAME, dtype_info
from weight_teleport.format import ChunkRef, read_header, write_pack
from weight_teleport.format.container import chunk_payload

DTYPES = [d.torch_dtype for d in BY_NAME.values()]
FLOAT_DTYPES = [d.torch_dtype for d in BY_NAME.values() if d.is_float]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a tensor (contiguous copy as integers)."""
    return t.detach().contiguous().view(dtype_info(t.dtype).int_torch)


def assert_bits_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        assert torch.equal(bits(a[k]), bits(b[k])), f"tensor {k!r} differs in its bit patterns"


def clone_state(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}


def from_bits(u: np.ndarray, dtype: torch.dtype, shape) -> torch.Tensor:
    """A tensor of `dtype` holding the bit patterns `u`."""
    info = dtype_info(dtype)
    signed = np.dtype(f"<i{info.nbytes}") if info.nbytes > 1 else np.dtype(np.uint8)
    u = np.ascontiguousarray(u.astype(info.uint_numpy))
    return torch.from_numpy(u.view(signed).copy()).view(dtype).reshape(shape)


def random_bits(rng: np.random.Generator, dtype: torch.dtype, n: int) -> np.ndarray:
    """Uniformly random bit patterns (0/1 for bool)."""
    info = dtype_info(dtype)
    u = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    if dtype == torch.bool:
        return (u & np.uint64(1)).astype(np.uint8)
    return (u & np.uint64((1 << info.bits) - 1)).astype(info.uint_numpy)


def weight_like(rng: np.random.Generator, dtype: torch.dtype, n: int) -> np.ndarray:
    """Bit patterns of N(0, 0.02)-like weights, or small integers for integer dtypes."""
    info = dtype_info(dtype)
    if not info.is_float:
        return random_bits(rng, dtype, n) & np.array(0x3F if dtype != torch.bool else 1, info.uint_numpy)
    vals = torch.from_numpy(rng.standard_normal(n) * 0.02).to(dtype)
    return vals.contiguous().view(info.int_torch).numpy().view(info.uint_numpy).copy()


SPECIALS = {
    torch.float32: [
        0x00000000,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7FC00001,
        0xFFBADBAD,
        0x00000001,
        0x807FFFFF,
        0x7F7FFFFF,
        0xFF7FFFFF,
    ],
    torch.float64: [
        0,
        1 << 63,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x7FF8000000000123,
        0xFFF0000000000001,
        1,
        0x800FFFFFFFFFFFFF,
        0x7FEFFFFFFFFFFFFF,
    ],
    torch.bfloat16: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFF81, 0x0001, 0x807F, 0x7F7F, 0xFF7F],
    torch.float16: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFC01, 0x0001, 0x83FF, 0x7BFF, 0xFBFF],
    torch.float8_e4m3fn: [0x00, 0x80, 0x7F, 0xFF, 0x01, 0x87, 0x7E, 0xFE],
    torch.float8_e5m2: [0x00, 0x80, 0x7C, 0xFC, 0x7D, 0xFF, 0x01, 0x83, 0x7B, 0xFB],
}


def specials(dtype: torch.dtype) -> list[int]:
    """Adversarial bit patterns: +-0, +-inf, NaNs with payloads, subnormals, extremes."""
    info = dtype_info(dtype)
    if info.is_float:
        return SPECIALS[dtype]
    if dtype == torch.bool:
        return [0, 1]
    top = (1 << info.bits) - 1
    return [0, 1, top, top >> 1, (top >> 1) + 1]


def with_renewed_crcs(pack: bytes, mutate) -> bytes:
    """`pack` with each chunk passed through `mutate(chunk_index, bytearray)` (which may
    resize it) and every chunk's offset and CRC-32 renewed: a faulty writer's pack, whose
    corruption reaches the stream decoders instead of stopping at the checksums."""
    header = read_header(pack)
    chunks, offset, i = [], 0, 0
    for t in header.tensors:
        refs = []
        for ref in t.chunks:
            data = bytearray(chunk_payload(pack, header, ref))
            mutate(i, data)
            i += 1
            refs.append(ChunkRef(offset, len(data), zlib.crc32(data)))
            chunks.append(bytes(data))
            offset += len(data)
        t.chunks = refs
    return write_pack(header, chunks)


def inverted_pair(n, seed):
    """Tiny elements (exponents of their own) nearly all change, the rest rarely: an
    inverted class."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(n, generator=g) * 0.02
    tiny = torch.rand(n, generator=g) < 0.2
    old = torch.where(tiny, old * 1e-6, old).bfloat16()
    moved = torch.where(tiny, torch.rand(n, generator=g) < 0.95, torch.rand(n, generator=g) < 0.05)
    return old, torch.where(moved, (old.float() * 1.5).bfloat16(), old)


CRC_LENGTHS = (0, 1, 255, 256, 257, 511, 512, 513, 3000, 32767, 32768, 32769, 17, 0, 100003)


def crc_ranges(seed: int = 0, lengths=CRC_LENGTHS):
    """(bytes, offsets, lengths) of awkward ranges for the GPU CRC-32: by default empty, single
    bytes, around the 256-byte piece and the 32 KB program, unaligned starts, one over 100 KB."""
    rng = np.random.default_rng(seed)
    lengths = np.array(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 3 * np.arange(lengths.size)
    data = rng.integers(0, 256, int(offsets[-1] + lengths[-1] + 5), dtype=np.uint8)
    return data, offsets, lengths


def decode_one_gap(extra: int, device):
    """(the symbol decoder's output, v) for one segment of one event whose gap value v is
    2^22 + `extra` (bucket 43, rc 0: residual +1): the largest a chunk holds for extra = 0."""
    from weight_teleport.codec.cuda.kernels import stage_symbols

    buf = torch.zeros(96, dtype=torch.uint8, device=device)
    buf[0] = 43 * 5
    buf[16:19] = torch.tensor(list(extra.to_bytes(3, "little")), dtype=torch.uint8)
    ints = lambda *a: torch.tensor(a, dtype=torch.int64, device=device)
    v = (1 << 22) + extra
    dec = stage_symbols.decode(
        buf,
        ints(0, 16, 32, 32).view(1, 4),
        ints(1, 3, 0, 0).view(1, 4),
        ints(1),
        ints(1),
        torch.zeros(1, dtype=torch.bool, device=device),
        ints(0),
        torch.zeros(v // 32 + 1, dtype=torch.int32, device=device),
        1,
        16,
    )
    return dec, v


def decoded_one_gap(dec, v: int) -> bool:
    """Whether `decode_one_gap`'s output is that event: its rank v - 1, the one set bit, +1."""
    words = dec.bitmap.cpu().numpy().view(np.uint32)
    return (
        int(dec.last_rank[0]) == v - 1
        and int(dec.residuals[0]) == 1
        and words[(v - 1) // 32] == 1 << ((v - 1) % 32)
        and np.count_nonzero(words) == 1
    )


def popcount_prefix(words: np.ndarray) -> np.ndarray:
    """The exclusive prefix of the popcounts of 32-bit words (int64)."""
    pc = np.unpackbits(np.ascontiguousarray(words).view(np.uint8)).reshape(-1, 32).sum(1, dtype=np.int64)
    return np.cumsum(pc) - pc


def chunk_table_failures(device) -> list[str]:
    """Chunk tables written by the CUDA backend's kernel (codec/cuda/kernels/stream_tables.py) on `device`,
    against the format's writer: random group counts, groups with and without streams,
    counts and lengths of 1 to 7 varint bytes. The chunks that differ, as messages."""
    from weight_teleport.codec.cuda.kernels import stream_tables
    from weight_teleport.format import Group, Stream, write_groups

    rng = np.random.default_rng(3)
    n, ncp = 30, 16
    n_groups = rng.integers(1, ncp + 1, size=n)
    events = rng.integers(0, 1 << 47, size=(n, ncp)) >> rng.integers(0, 47, size=(n, ncp))
    has = rng.random((n, ncp)) < 0.7
    has[0] = False
    codec = rng.integers(0, 4, size=(n, ncp, 4))
    raw = rng.integers(0, 1 << 30, size=(n, ncp, 4)) >> rng.integers(0, 30, size=(n, ncp, 4))
    stored = rng.integers(0, 1 << 15, size=(n, ncp, 4)) >> rng.integers(0, 15, size=(n, ncp, 4))
    on = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
    heads = stream_tables.Tables(on(n_groups), on(events), on(has), on(codec), on(raw), on(stored))
    lengths = heads.lengths()
    out = torch.zeros(int(lengths.sum()), dtype=torch.uint8, device=device)
    heads.write(out, lengths.cumsum(0) - lengths)
    data, lengths = out.cpu().numpy(), lengths.cpu().numpy()
    failures, at = [], 0
    for k in range(n):
        groups = [
            Group(
                int(events[k, c]),
                [Stream(int(codec[k, c, j]), int(raw[k, c, j]), bytes(int(stored[k, c, j]))) for j in range(4)],
            )
            if has[k, c]
            else Group(0, [])
            for c in range(n_groups[k])
        ]
        want = write_groups(groups)
        body = sum(int(stored[k, c].sum()) for c in range(n_groups[k]) if has[k, c])
        if data[at : at + lengths[k]].tobytes() != want[: len(want) - body]:
            failures.append(f"chunk table {k} differs from the format writer's")
        at += lengths[k]
    return failures
