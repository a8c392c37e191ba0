"""Zstandard frames of Huffman-coded literals (codec/cuda/zstd_literals/reference.py): every frame decodes
with the zstd library to its stream, on random and adversarial streams; the GPU writes the
same bytes (codec/cuda/zstd_literals/gpu_writer.py)."""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_teleport.codec.cuda.zstd_literals import reference as H

SIZES = [
    16,
    17,
    255,
    256,
    1023,
    1024,
    1025,
    16383,
    16384,
    65791,
    65792,
    H.BLOCK_BYTES,
    H.BLOCK_BYTES + 1,
    3 * H.BLOCK_BYTES + 7,
]


def _fibonacci(n: int, rng) -> np.ndarray:
    """Symbol i with the i-th Fibonacci count: a Huffman tree deeper than 11 bits."""
    counts, a, b = [], 1, 1
    for _ in range(25):
        counts.append(a)
        a, b = b, a + b
    sym = np.repeat(np.arange(25), counts)
    return rng.permutation(sym)[:n] if sym.size >= n else rng.choice(sym, n)


def _streams(rng):
    for n in SIZES:
        yield f"geometric {n}", np.minimum(rng.geometric(0.3, n) - 1, 128)
        yield f"wide geometric {n}", np.minimum(rng.geometric(0.02, n) - 1, 255)
        yield f"two symbols {n}", rng.integers(0, 2, n) * 128
        yield f"one symbol {n}", np.full(n, 5)
        yield f"uniform 0-128 {n}", rng.integers(0, 129, n)
        yield f"uniform bytes {n}", rng.integers(0, 256, n)
        yield f"rare symbols {n}", np.where(rng.random(n) < 0.999, 3, rng.integers(0, 256, n))
        yield f"few high symbols {n}", np.where(rng.random(n) < 0.99, rng.integers(0, 8, n), rng.integers(129, 256, n))
        yield f"fibonacci {n}", _fibonacci(n, rng)
        yield f"blocks alike and not {n}", np.where(np.arange(n) < H.BLOCK_BYTES, 7, rng.integers(0, 4, n))


def _check(data: np.ndarray) -> bytes:
    f = H.frame(data.astype(np.uint8).tobytes())
    assert zstandard.ZstdDecompressor().decompress(f) == data.astype(np.uint8).tobytes()
    return f


@pytest.mark.parametrize(
    "name,data", list(_streams(np.random.default_rng(0))), ids=lambda x: x if isinstance(x, str) else ""
)
def test_frames_decode_with_zstd(name, data):
    _check(data)


@settings(max_examples=80, deadline=None)
@given(st.binary(min_size=1, max_size=5000), st.integers(0, 255))
def test_random_streams_decode(raw, cap):
    data = np.frombuffer(raw, np.uint8)
    _check(data)
    _check(np.minimum(data, cap))


def test_frame_header_sizes():
    sizes = np.array(SIZES + [1, 255, 65791, 65792, 1 << 24])
    assert H.frame_header_size(sizes).tolist() == [len(H.frame_header(int(n))) for n in sizes]


def test_code_lengths_are_limited_and_complete():
    hist = np.zeros(256, np.int64)
    hist[:25] = [int(x) for x in np.bincount(_fibonacci(200000, np.random.default_rng(1)), minlength=25)]
    lengths = H.code_lengths(hist)
    present = lengths[hist > 0]
    assert present.max() == H.MAX_BITS and (lengths[hist == 0] == 0).all()
    assert sum(2.0 ** -int(x) for x in present) == 1.0


def test_weights_past_symbol_128_are_fse_compressed():
    """Skewed streams with symbols past 128 (their trees need the FSE form of the weights,
    with runs of absent weight values) come out smaller than raw; uniform bytes (one weight
    value: no FSE form) are stored as raw blocks."""
    rng = np.random.default_rng(3)
    for n in (300, 5000, 70000):
        skewed = np.where(rng.random(n) < 0.99, rng.integers(0, 8, n), rng.integers(129, 256, n))
        assert len(_check(skewed)) < n * 0.6
        weights = np.array([1, 1, 5, 5, 5, 9] * 30)  # values 0, 2-4, 6-8 absent: zero runs
        assert H._fse_weights(weights) is not None
    assert len(_check(np.arange(1 << 16) % 256)) > 1 << 16
    assert H._fse_weights(np.full(200, 3)) is None


@pytest.fixture(scope="module")
def host_writer(tmp_path_factory):
    """huffman.cu's code_lengths() and describe(), compiled for the host."""
    if shutil.which("g++") is None:
        pytest.skip("needs a host C++ compiler")
    from weight_teleport.codec.cuda.zstd_literals import gpu_writer

    src = gpu_writer.SOURCE.read_text()
    part = src[src.index("// HOST-TESTED BEGIN") : src.index("// HOST-TESTED END")]
    head = src[src.index("typedef long long i64;") : src.index("__device__ __forceinline__ void put_byte")]
    d = tmp_path_factory.mktemp("huffman")
    (d / "writer.cpp").write_text(
        "#define __device__\n#define __forceinline__ inline\n#define __clz(x) __builtin_clz(x)\n"
        + head
        + part
        + 'extern "C" int describe_c(const unsigned char* L, int last, int top, unsigned char* t) '
        "{ return describe(L, last, top, t); }\n"
        'extern "C" void lengths_c(const int* total, const int* order, int m, unsigned char* L) '
        "{ int cnt[511]; short parent[511]; unsigned char depth[511]; "
        "code_lengths(total, order, m, cnt, parent, depth, L); }\n"
    )
    lib = d / "writer.so"
    defines = gpu_writer._module().options  # the CTA shapes gpu_writer.py launches with
    subprocess.run(
        ["g++", "-O1", "-std=c++17", "-shared", "-fPIC", *defines, "-o", str(lib), str(d / "writer.cpp")], check=True
    )
    return ctypes.CDLL(str(lib))


def _histograms(rng, n: int):
    """Histograms of random streams, and edge cases: two symbols, all 256 alike, Fibonacci
    counts (deeper than 11 bits), one huge count beside many ones."""
    yield np.bincount([0, 1, 1], minlength=256)
    yield np.full(256, 7)
    yield np.bincount(_fibonacci(100000, rng), minlength=256)
    yield np.r_[[1 << 20], np.ones(255, np.int64)]
    for trial in range(n):
        size = int(rng.integers(20, 20000))
        if trial % 5 == 4:  # counts with many ties, or powers of two: trees deeper than 11 bits, both repairs
            hist = np.zeros(256, np.int64)
            m = int(rng.integers(2, 257))
            hist[rng.choice(256, m, replace=False)] = (
                rng.integers(1, 3, m) if trial % 2 else 2 ** rng.integers(0, 17, m)
            )
            yield hist
            continue
        yield np.bincount(
            [
                np.minimum(rng.geometric(0.02, size) - 1, 255),
                rng.integers(0, 256, size),
                np.where(rng.random(size) < 0.99, rng.integers(0, 8, size), rng.integers(129, 256, size)),
                np.minimum(rng.geometric(0.3, size) - 1, 40) * 5 + rng.integers(0, 5, size),
            ][trial % 5].astype(np.uint8),
            minlength=256,
        )


def test_cuda_code_lengths_and_trees_equal_the_reference(host_writer):
    """The CUDA plan's code lengths and tree descriptions (huffman.cu's code_lengths() and
    describe(), compiled for the host) against the reference's `code_lengths` and `_tree`."""
    from weight_teleport.codec.cuda.zstd_literals import gpu_writer

    fse = 0
    for hist in _histograms(np.random.default_rng(5), 400):
        order = np.array(sorted(np.flatnonzero(hist), key=lambda s: (hist[s], s)), np.int32)
        lengths = (ctypes.c_ubyte * 256)()
        host_writer.lengths_c(
            np.ascontiguousarray(hist, np.int32).ctypes.data_as(ctypes.c_void_p),
            order.ctypes.data_as(ctypes.c_void_p),
            order.size,
            lengths,
        )
        expect = H.code_lengths(hist)
        assert list(lengths) == expect.tolist()
        last = int(np.flatnonzero(hist).max())
        out = (ctypes.c_ubyte * gpu_writer.TREE_MAX)()
        k = host_writer.describe_c(lengths, last, int(expect.max()), out)
        assert (bytes(out[:k]) if k else None) == H._tree(expect, last)
        fse += last > H.MAX_SYMBOL and k > 0
    assert fse > 100


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda)")
def test_gpu_frames_equal_the_reference():
    from weight_teleport.codec.cuda.zstd_literals import gpu_writer

    streams = [d.astype(np.uint8) for _, d in _streams(np.random.default_rng(2))]
    lengths = np.array([s.size for s in streams], np.int64)
    offsets = np.cumsum(-(-lengths // 64) * 64) - -(-lengths // 64) * 64
    host = np.zeros(int(offsets[-1] + lengths[-1]), np.uint8)
    for o, s in zip(offsets, streams):
        host[o : o + s.size] = s
    buffer = torch.from_numpy(host).cuda()
    blocks = int((-(-lengths // H.BLOCK_BYTES)).sum())
    on_gpu = lambda a: torch.from_numpy(a).cuda()
    p = gpu_writer.plan(buffer, on_gpu(offsets), on_gpu(lengths), 1, blocks + 7)  # 7 empty blocks past the streams'
    sizes = gpu_writer.frame_sizes(p).cpu().numpy()
    refs = [H.frame(s.tobytes()) for s in streams]
    assert sizes.tolist() == [len(r) for r in refs]
    take = np.arange(lengths.size) % 3 != 1  # the others left out, as streams stored raw are
    at = np.cumsum(np.where(take, sizes, 0) + 5) - np.where(take, sizes, 0)  # 5 bytes before each frame
    out = torch.zeros(-(-int(at[-1] + sizes[-1]) // 4), dtype=torch.int32, device="cuda")
    gpu_writer.write(buffer, p, on_gpu(take), on_gpu(at), out)
    got = out.view(torch.uint8).cpu().numpy()
    written = np.zeros(got.size, bool)
    for k in np.flatnonzero(take):
        assert got[at[k] : at[k] + sizes[k]].tobytes() == refs[k], f"stream {k}"
        written[at[k] : at[k] + sizes[k]] = True
    assert not got[~written].any()  # nothing outside the frames taken


@pytest.mark.parametrize("min_length,extra", [(1, 0), (16, 5)])
def test_block_table_matches_the_streams(min_length, extra):
    """The device-made block table (torch, run here on CPU tensors): every stream of at least
    min_length bytes cut into BLOCK_BYTES blocks in order, with its frame and last flags,
    then `extra` empty blocks."""
    from weight_teleport.codec.cuda.zstd_literals import gpu_writer

    B = H.BLOCK_BYTES
    lengths = np.array([0, 15, 16, 1, B - 1, B, B + 1, 3 * B, 0, 17, 2 * B + 5, 255, 256, 65791, 65792], np.int64)
    offsets = np.cumsum(lengths + 7) * 16
    bl = gpu_writer.blocks(
        torch.from_numpy(offsets),
        torch.from_numpy(lengths),
        min_length,
        int((-(-lengths[lengths >= min_length] // B)).sum()) + extra,
    )
    want = [(s, k) for s in range(lengths.size) if lengths[s] >= min_length for k in range(-(-lengths[s] // B))]
    n = len(want)
    got = list(zip(bl.stream.tolist(), (torch.arange(bl.stream.numel()) - bl.first).tolist()))
    assert got[:n] == want and all(s == lengths.size for s, _ in got[n:]) and len(got) == n + extra
    for i, (s, k) in enumerate(want):
        assert bl.src[i] == offsets[s] + k * B and bl.size[i] == min(lengths[s] - k * B, B)
        assert bl.frame[i] == (lengths[s] if k == 0 else 0) and bl.last[i] == (k == -(-lengths[s] // B) - 1)
    assert (bl.size[n:] == 0).all()
    assert bl.header[:-1].tolist() == H.frame_header_size(lengths).tolist()
