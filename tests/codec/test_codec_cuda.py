"""The codec on CUDA tensors, what only a GPU runs: its own stream coders (Huffman, nvCOMP)
and CPU<->GPU cross decoding, pinned packs and memory, CUDA C warp kernels, corrupt packs
under nvCOMP. The checks every backend passes (the Triton interpreter's among them) are the
conformance suite's: tests/codec/test_conformance.py."""

import numpy as np
import pytest
import torch
from helpers import DTYPES, assert_bits_equal, clone_state, inverted_pair, with_renewed_crcs
from test_codec_roundtrip import make_pair

import weight_teleport as wt
from weight_teleport.codec import pinned_pack
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.errors import PackFormatError, PackMismatchError, UnsupportedFormatError, WeightTeleportError
from weight_teleport.format import read_groups, read_header

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda)"),
]
pytest.importorskip("triton", reason="the CUDA backend needs triton")


def _cuda(state):
    return {k: v.cuda() for k, v in state.items()}


def _cpu(state):
    return {k: v.cpu() for k, v in state.items()}


def _pair(seed, dtype, mode, p, change="ulp", shape=(37, 29)):
    old, new = make_pair(seed, dtype, shape, "weights", mode, change, p)
    return {"w": old, "b": old.flip(0).contiguous()}, {"w": new, "b": new.flip(0).contiguous()}


@pytest.mark.parametrize("pieces", [(), (17, 0, 23)], ids=["one-piece", "three-pieces"])
@pytest.mark.parametrize("warp_kernels", [True, False], ids=["cuda-c", "triton"])
def test_gpu_symbol_streams_match_cpu_kernel(warp_kernels, pieces, monkeypatch):
    """Both symbol coders (encode_symbols.cu, and the Triton kernel) write the CPU kernel's bytes:
    segments from empty to thousands of events (many 32-event steps of a warp, extra bits
    carried across them), gaps from 1 to millions, every residual form; with the ranks and
    residuals in one tensor each, or in a tensor per piece of the segments (an empty one
    among them)."""
    from weight_teleport.codec.cpu import kernels as K
    from weight_teleport.codec.cuda.kernels import encode_symbols, warp

    monkeypatch.setattr(warp, "enabled", warp_kernels)
    rng = np.random.default_rng(0)
    for width in (8, 16, 32, 64):
        wm = (1 << width) - 1
        ranks, res, ev, rc, inv, ref = [], [], [], [], [], []
        for s in range(40):
            iv = bool(rng.random() < 0.3)
            n = int(rng.integers(0, 300)) if s % 8 else int(rng.integers(1000, 6000))
            r = np.sort(rng.choice(8000 if s % 3 else 10**7, size=n, replace=False)).astype(np.int64)
            nres = int(rng.integers(0, 50 if s % 8 else 3000)) if iv else n
            rv = rng.integers(1, 6, size=nres).astype(np.uint64)
            big = rng.random(nres) < 0.1
            rv[big] = rng.integers(1, min(wm, 2**62), size=int(big.sum())).astype(np.uint64)
            neg = rng.random(nres) < 0.5
            rv[neg] = (np.uint64(wm) - rv[neg] + np.uint64(1)) & np.uint64(wm)
            rv[rv == 0] = 1
            syms, bb = np.empty(n, np.uint8), np.empty(n * 4 + 8, np.uint8)
            rsy, esc = np.empty(max(n, nres), np.uint8), np.empty(max(n, nres), np.uint64)
            nb, nr, ne = K.class_to_symbols(
                np.diff(r, prepend=-1) - 1, rv, not iv, np.uint64(1 << (width - 1)), np.uint64(wm), syms, bb, rsy, esc
            )
            ref.append(
                [syms.tobytes(), bb[:nb].tobytes(), rsy[:nr].tobytes(), esc[:ne].astype(f"<u{width // 8}").tobytes()]
            )
            ranks.append(r.astype(np.int32))
            res.append(rv.astype(f"u{width // 8}").view(f"i{width // 8}"))  # stored in the elements' width
            ev, rc, inv = ev + [n], rc + [nres], inv + [iv]
        seg = encode_symbols.Segments(np.array(ev, np.int64), np.array(rc, np.int64), np.array(inv), width, pieces)
        at = np.cumsum([0, *(pieces or (40,))])
        split = lambda arrays, dtype: [
            torch.from_numpy(np.concatenate([np.zeros(0, dtype), *arrays[a:b]])).cuda() for a, b in zip(at, at[1:])
        ]
        out = encode_symbols.encode(split(ranks, np.int32), split(res, f"i{width // 8}"), seg)
        buf = out.buffer.cpu().numpy()
        offsets, lengths = out.on_host()
        got = [[buf[o : o + n].tobytes() for o, n in zip(offsets[s], lengths[s])] for s in range(40)]
        assert out.segment_bytes.tolist() == [sum(map(len, r)) for r in ref]
        assert got == ref


def test_nvcomp_streams_round_trip_and_cpu_decodes_zstd():
    import zstandard

    from weight_teleport.codec.cuda.runtime import nvcomp

    if not nvcomp.available():
        pytest.skip("nvCOMP (nvidia-libnvcomp-cu13) is not installed")
    rng = np.random.default_rng(1)
    raws = [
        np.minimum(rng.geometric(0.3, size=int(n)), 255).astype(np.uint8) for n in rng.integers(16, 200000, size=60)
    ]
    lengths = np.array([r.size for r in raws], np.int64)
    offs = np.concatenate([[0], np.cumsum(-(-lengths // 16) * 16)[:-1]]).astype(np.int64)
    host = np.zeros(int(offs[-1] + lengths[-1] + 16), np.uint8)
    for r, o in zip(raws, offs):
        host[o : o + r.size] = r
    src = torch.from_numpy(host).cuda()
    for alg in ("zstd", "lz4", "ans"):
        cfg = CudaCodecConfig()  # the decompression backend
        out, out_off, pend = nvcomp.compress(alg, src, offs, lengths)
        sizes, st = (pend.unpermute(t.cpu().numpy()) for t in pend.host())
        assert (st == 0).all()
        comp = out.cpu().numpy()
        if alg == "zstd":
            for r, o, n in zip(raws, out_off, sizes):
                assert (
                    zstandard.ZstdDecompressor().decompress(comp[o : o + n].tobytes(), max_output_size=r.size)
                    == r.tobytes()
                )
        dst = torch.full_like(src, 7)
        codec = np.full(lengths.size, nvcomp.CODEC_ID[alg], np.int64)
        plan = nvcomp.plan_decompress(
            cfg, out_off, sizes, offs, lengths, torch.cuda.current_stream().cuda_stream, codec
        )
        back = nvcomp.decompress(cfg, out, dst, plan)
        got, st = (back.unpermute(t.cpu().numpy()) for t in back.host())
        assert (st == 0).all() and np.array_equal(got, lengths)
        d = dst.cpu().numpy()
        assert all(np.array_equal(d[o : o + r.size], r) for r, o in zip(raws, offs))


def test_gpu_only_stream_codec_is_refused_on_cpu():
    from weight_teleport.codec.cuda.runtime import nvcomp

    if not nvcomp.available():
        pytest.skip("nvCOMP (nvidia-libnvcomp-cu13) is not installed")
    old, new = _pair(2, torch.bfloat16, "density", 0.05, shape=(300, 64))
    pack = wt.encode_delta(
        _cuda(old), _cuda(new), base_version=0, version=1, cuda=CudaCodecConfig(stream_coder="nvcomp-ans")
    )
    assert "nvcomp-ans" in read_header(pack).stream_codecs
    with pytest.raises(UnsupportedFormatError, match="stream_coder='huffman'"):
        wt.apply_delta(clone_state(old), pack)


def _flip(chunk: int, where, bits: int):
    """A `with_renewed_crcs` mutation: byte where(len) of chunk `chunk` XOR `bits`."""

    def mutate(i, c):
        if i == chunk:
            c[where(len(c))] ^= bits

    return mutate


def _refusals(old, new, pack: bytes, mutations) -> int:
    """How many of the packs `mutations` make of `pack` (CRCs renewed) CUDA weights refuse;
    a refused pack leaves them untouched, an accepted one must give `new` bit for bit."""
    refused = 0
    for mutate in mutations:
        state = _cuda(old)
        try:
            wt.apply_delta(state, with_renewed_crcs(pack, mutate))
        except WeightTeleportError:
            refused += 1
            assert_bits_equal(_cpu(state), old)
        else:
            assert_bits_equal(_cpu(state), new)
    return refused


def _gpu_only_pack(algorithm):
    from weight_teleport.codec.cuda.runtime import nvcomp

    if not nvcomp.available():
        pytest.skip("nvCOMP (nvidia-libnvcomp-cu13) is not installed")
    old, new = _pair(5, torch.bfloat16, "density", 0.1, shape=(600, 96))
    old["f"], new["f"] = (t["w"].float() for t in (old, new))
    pack = wt.encode_delta(
        _cuda(old),
        _cuda(new),
        base_version=0,
        version=1,
        chunk_elems=4096,
        cuda=CudaCodecConfig(stream_coder=f"nvcomp-{algorithm}"),
    )
    return old, new, pack


@pytest.mark.parametrize("algorithm", ["lz4", "ans"])
def test_gpu_only_stream_codecs_stage_on_gpu(algorithm, monkeypatch):
    """Packs of the GPU-only stream codecs decode bit-exactly onto CUDA weights with either
    of nvCOMP's software backends; a corrupt chunk under a valid CRC is refused with the
    weights untouched; without nvCOMP they are refused with the install command."""
    from weight_teleport.codec import streams as codecs
    from weight_teleport.codec.cuda.runtime import nvcomp

    old, new, pack = _gpu_only_pack(algorithm)
    header = read_header(pack)
    assert codecs.NAMES[nvcomp.CODEC_ID[algorithm]] in header.stream_codecs
    used = {
        s.codec
        for t in header.tensors
        for c in t.chunks
        for g in read_groups(pack[header.payload_offset + c.offset :][: c.length])
        for s in g.streams
    }
    assert nvcomp.CODEC_ID[algorithm] in used
    for backend in ("default", "cuda"):
        state = _cuda(old)
        wt.apply_delta(state, pack, cuda=CudaCodecConfig(decompress_backend=backend))
        assert_bits_equal(_cpu(state), new)
    n_chunks = sum(len(t.chunks) for t in header.tensors)
    flips = [_flip(ci, lambda n: n - 5, 0x41) for ci in range(n_chunks)]  # in each chunk's last stream
    assert _refusals(old, new, pack, flips) >= n_chunks // 2
    monkeypatch.setattr(nvcomp, "available", lambda: False)
    with pytest.raises(UnsupportedFormatError, match=r"weight-teleport\[cuda\]"):
        wt.apply_delta(_cuda(old), pack)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 10,
    reason="Blackwell has the decompression engine",
)
def test_hardware_decompression_backend_raises_before_blackwell():
    """nvCOMP's hardware backend (Blackwell's decompression engine) refuses to run on an
    older GPU: the stage raises and writes nothing."""
    old, new, pack = _gpu_only_pack("lz4")
    state = _cuda(old)
    with pytest.raises(RuntimeError, match="nvcompStatus"):
        wt.apply_delta(state, pack, cuda=CudaCodecConfig(decompress_backend="hardware"))
    assert_bits_equal(_cpu(state), old)


@pytest.mark.parametrize("chunk", [8, 24, 4096, 1 << 22])
def test_cross_decoding_both_ways(chunk):
    old, new = _pair(3, torch.bfloat16, "density", 0.03, "random", shape=(300, 77))
    cpu_pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=chunk)
    gpu_pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1, chunk_elems=chunk)
    on_cpu, on_gpu = clone_state(old), _cuda(old)
    wt.apply_delta(on_cpu, gpu_pack)
    wt.apply_delta(on_gpu, cpu_pack)
    assert_bits_equal(on_cpu, new)
    assert_bits_equal(_cpu(on_gpu), new)


def test_non_contiguous_state_and_inputs():
    old, new = make_pair(5, torch.bfloat16, (64, 48), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"x": old.cuda().t()}, {"x": new.cuda().t()}, base_version=0, version=1, chunk_elems=64)
    buf = old.cuda()
    state = {"x": buf.t()}
    wt.apply_delta(state, pack)
    assert_bits_equal({"x": buf.cpu()}, {"x": new})


def _corrupt(pack: bytes, at: int) -> bytes:
    b = bytearray(pack)
    b[at] ^= 0x5A
    return bytes(b)


def test_corrupt_packs_leave_gpu_weights_untouched():
    old, new = _pair(4, torch.bfloat16, "density", 0.02, shape=(200, 64))
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=1024)
    rng = np.random.default_rng(0)
    for at in rng.integers(0, len(pack), size=40):
        state = _cuda(old)
        with pytest.raises(WeightTeleportError):
            wt.apply_delta(state, _corrupt(pack, int(at)))
        assert_bits_equal(_cpu(state), old)
    with pytest.raises(PackFormatError):
        wt.apply_delta(_cuda(old), pack[:-3])


def test_wrong_base_weights_are_refused():
    old, new = _pair(6, torch.bfloat16, "density", 0.02)
    pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1)
    state = _cuda(new)
    with pytest.raises(WeightTeleportError):
        wt.apply_delta(state, pack)
    assert_bits_equal(_cpu(state), new)


def test_pack_in_pinned_memory_is_staged_from_where_it_is(monkeypatch):
    """A pinned pack is copied to the device directly (never through the pinned ring) and
    stages the same patch; a corrupt one is refused and changes nothing."""
    from weight_teleport.codec.cuda.runtime import memory
    from weight_teleport.codec.cuda.stage import decode_streams

    old, new = _pair(9, torch.bfloat16, "density", 0.05, shape=(300, 70))
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=2048)
    pinned = pinned_pack(pack)
    assert memory.pinned(pinned) is not None and memory.pinned(pack) is None
    assert bytes(pinned) == pack
    state = _cuda(old)
    want = wt.stage_delta(state, pack)
    monkeypatch.setattr(decode_streams, "_pack_ring", None)  # the ring is not used: None would raise
    got = wt.stage_delta(state, pinned)
    assert all(
        torch.equal(a.offsets, b.offsets) and torch.equal(a.values, b.values)
        for a, b in zip(want.groups, got.groups, strict=True)
    )
    wt.apply_staged(state, got)
    assert_bits_equal(_cpu(state), new)
    state = _cuda(old)
    pinned[len(pinned) - 5] ^= 0x40
    with pytest.raises(WeightTeleportError):
        wt.apply_delta(state, pinned)
    assert_bits_equal(_cpu(state), old)


@pytest.mark.parametrize("waves", [1, 2])
def test_pinned_packs_are_the_bytes_packs(waves, monkeypatch):
    """encode_delta(pinned=True) writes the `bytes` pack's bytes into pinned memory: one
    batch's payload (also one merged from two waves) is copied from the GPU behind room for
    the header and not copied again; several batches, dense tensors and snapshots are joined
    into it on the host."""
    from weight_teleport.codec.cuda.encode import encoder
    from weight_teleport.codec.cuda.runtime import memory

    if waves == 2:
        monkeypatch.setattr(encoder, "WAVE_ELEMS", 0)
    from weight_teleport.format import container

    joins = []
    fill = container.fill
    monkeypatch.setattr(container, "fill", lambda dst, parts, *a: joins.append(len(parts)) or fill(dst, parts, *a))
    old, new = _pair(11, torch.bfloat16, "density", 0.05, shape=(300, 70))
    pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1, chunk_elems=2048, pinned=True)
    assert isinstance(pack, np.ndarray) and memory.pinned(pack) is not None and not joins
    assert bytes(pack) == wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1, chunk_elems=2048)
    state = _cuda(old)
    wt.apply_delta(state, pack, base_version=0)
    assert_bits_equal(_cpu(state), new)
    old, new = {}, {}
    for i, (dt, mode, p) in enumerate(
        [(torch.bfloat16, "density", 0.02), (torch.float32, "density", 0.05), (torch.float16, "all", 0.0)]
    ):
        old[f"t{i}"], new[f"t{i}"] = make_pair(30 + i, dt, (70, 33), "weights", mode, "ulp", p)
    cfg = CudaCodecConfig(stream_coder="cpu-zstd")
    pack = wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1, chunk_elems=512, cuda=cfg, pinned=True)
    assert bytes(pack) == wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=512) and joins
    joins.clear()
    snap = wt.encode_snapshot(_cuda(new), version=1, pinned=True)
    assert memory.pinned(snap) is not None and not joins, "the snapshot's payload was copied on the host"
    assert bytes(snap) == wt.encode_snapshot(_cuda(new), version=1)
    assert_bits_equal(wt.decode_snapshot(bytes(snap)), new)


@pytest.mark.parametrize("budget", [None, 1 << 30, 0])
def test_staged_patch_held_on_device_or_in_pinned_host_memory(budget):
    """Over its device budget a staged patch moves to pinned host memory; apply is the same."""
    old, new = _pair(8, torch.bfloat16, "density", 0.05, shape=(100, 50))
    pack = wt.encode_delta(old, new, base_version=0, version=1)
    state = _cuda(old)
    staged = wt.stage_delta(state, pack, device_budget=budget)
    arrays = [a for g in staged.groups for a in (g.rows, g.offsets, g.values)]
    assert staged.nbytes > 0 and arrays
    on_host = budget == 0
    assert all(a.is_cuda != on_host for a in arrays)
    assert all(a.is_pinned() for a in arrays) or not on_host
    wt.apply_staged(state, staged)
    assert_bits_equal(_cpu(state), new)


@pytest.mark.parametrize("with_nvcomp", [True, False])
def test_corrupt_streams_with_valid_crcs_are_refused_on_gpu(with_nvcomp, monkeypatch):
    from weight_teleport.codec.cuda.runtime import nvcomp

    if not with_nvcomp:
        monkeypatch.setattr(nvcomp, "available", lambda: False)
    old, new = _pair(4, torch.bfloat16, "density", 0.02, shape=(200, 64))
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=1024, level=-5)
    n_chunks = sum(len(t.chunks) for t in read_header(pack).tensors)
    rng = np.random.default_rng(1)
    flips = []
    for _ in range(40):  # the draws in the order they were made before the helper
        ci, bits, at = int(rng.integers(n_chunks)), int(rng.integers(1, 256)), rng.random()
        flips.append(_flip(ci, lambda n, at=at: int(at * n), bits))
    assert _refusals(old, new, pack, flips) >= 30


def test_staged_changes_use_four_byte_offsets():
    old, new = _pair(12, torch.bfloat16, "density", 0.05, shape=(300, 50))
    state = _cuda(old)
    staged = wt.stage_delta(state, wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=4096))
    assert all(g.offsets.dtype == torch.int32 for g in staged.groups) and staged.groups
    wt.apply_staged(state, staged)
    assert_bits_equal(_cpu(state), new)


@pytest.mark.parametrize("waves", [1, 2])
def test_mixed_batches_match_cpu_pack(waves, monkeypatch):
    """Several dtypes, unchanged, empty and dense tensors in one pack: one batch per dtype;
    with two waves (each dtype's batches of the two merged), in one part or in pinned
    memory."""
    from weight_teleport.codec.cuda.encode import encoder

    if waves == 2:
        monkeypatch.setattr(encoder, "WAVE_ELEMS", 0)
    old, new = {}, {}
    for i, (dt, mode, p) in enumerate(
        [
            (torch.bfloat16, "density", 0.02),
            (torch.float32, "density", 0.05),
            (torch.bfloat16, "none", 0.0),
            (torch.int8, "density", 0.5),
            (torch.bfloat16, "density", 0.01),
            (torch.float16, "all", 0.0),
        ]
    ):
        old[f"t{i}"], new[f"t{i}"] = make_pair(20 + i, dt, (70, 33), "weights", mode, "ulp", p)
    old["empty"], new["empty"] = torch.zeros(0, 5, dtype=torch.bfloat16), torch.zeros(0, 5, dtype=torch.bfloat16)
    cpu_pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=512)
    for pinned in (False, True):
        gpu_pack = wt.encode_delta(
            _cuda(old),
            _cuda(new),
            base_version=0,
            version=1,
            chunk_elems=512,
            cuda=CudaCodecConfig(stream_coder="cpu-zstd"),
            pinned=pinned,
        )
        assert bytes(gpu_pack) == cpu_pack
    state = clone_state(old)
    wt.apply_delta(state, wt.encode_delta(_cuda(old), _cuda(new), base_version=0, version=1, chunk_elems=512))
    assert_bits_equal(state, new)


def test_unaligned_views_in_a_batch_match_cpu_pack():
    """Tensors starting off 8-byte boundaries (views into a larger buffer) beside aligned
    ones of the same and of another dtype: the scan reads words, so it copies those."""
    old, new = {}, {}
    for i, dt in enumerate([torch.float32, torch.bfloat16, torch.bfloat16, torch.float8_e4m3fn]):
        o, n = make_pair(40 + i, dt, (1601,), "weights", "density", "ulp", 0.03)
        old[f"t{i}"], new[f"t{i}"] = o.cuda()[i % 2 :], n.cuda()[i % 2 :]
    cpu_pack = wt.encode_delta(_cpu(old), _cpu(new), base_version=0, version=1, chunk_elems=512)
    for _ in range(2):  # the second call reuses the first one's staging buffers
        assert (
            wt.encode_delta(
                old, new, base_version=0, version=1, chunk_elems=512, cuda=CudaCodecConfig(stream_coder="cpu-zstd")
            )
            == cpu_pack
        )
    state = {k: v.clone() for k, v in old.items()}
    wt.apply_delta(state, cpu_pack, base_version=0)
    assert_bits_equal(_cpu(state), _cpu(new))


def test_stage_of_dtypes_sharing_a_width():
    """Element types of one width with other bit layouts in one state (bfloat16, float16 and
    int16; float32 and int32; the float8 types, int8 and uint8): each is staged with its own
    layout, bit-exact, where they once shared a batch and a valid pack was refused."""
    old, new = {}, {}
    for i, dt in enumerate(
        [
            torch.bfloat16,
            torch.float16,
            torch.int16,
            torch.float32,
            torch.int32,
            torch.float8_e4m3fn,
            torch.float8_e5m2,
            torch.int8,
            torch.uint8,
        ]
    ):
        old[f"t{i}"], new[f"t{i}"] = make_pair(70 + i, dt, (5, 1003), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=2056)
    state = _cuda(old)
    report = wt.apply_delta(state, pack, base_version=0)
    assert report.digest_verified
    assert_bits_equal(_cpu(state), new)
    assert (
        wt.encode_delta(
            _cuda(old),
            _cuda(new),
            base_version=0,
            version=1,
            chunk_elems=2056,
            cuda=CudaCodecConfig(stream_coder="cpu-zstd"),
        )
        == pack
    )  # the CPU's zstd: the same bytes


@pytest.mark.parametrize("offset", [1, 3])
def test_stage_onto_live_views_off_word_boundaries(offset):
    """Live tensors that start off an 8-byte boundary (views into a larger buffer): the base
    check's digest and the patched weights are exact, and a wrong base is refused."""
    old, new, views = {}, {}, {}
    for i, dt in enumerate([torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float16]):
        o, n = make_pair(60 + i, dt, (3, 2051), "weights", "density", "ulp", 0.05)
        size = o.element_size()
        raw = torch.zeros((o.numel() + 8) * size, dtype=torch.uint8, device="cuda")
        view = raw[offset * size : (offset + o.numel()) * size].view(dt).view(o.shape)
        view.view(torch.uint8).copy_(o.contiguous().view(torch.uint8).cuda())
        assert view.data_ptr() % 8 != 0
        old[f"t{i}"], new[f"t{i}"], views[f"t{i}"] = o, n, view
    assert_bits_equal(_cpu(views), old)
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=2056)
    wrong = dict(views, t1=views["t1"].clone())
    wrong["t1"].view(torch.int32).view(-1)[5] ^= 1
    with pytest.raises(PackMismatchError):
        wt.stage_delta(wrong, pack)
    report = wt.apply_delta(views, pack, base_version=0)
    assert report.digest_verified
    assert_bits_equal(_cpu(views), new)


@pytest.mark.parametrize("case", [*DTYPES, "inverted"])
def test_warp_kernels_match_triton_kernels(case, monkeypatch):
    """The CUDA C warp kernels and the Triton kernels write the same packs and stage patches
    that apply to the same bits, over several chunks of several blocks with ragged ends."""
    from weight_teleport.codec.cuda.kernels import warp

    if case == "inverted":
        o, m = inverted_pair(50_001, 4)
        old, new = {"w": o}, {"w": m}
    else:
        old, new = _pair(3, case, "density", 0.05, shape=(301, 70))
    old, new = _cuda(old), _cuda(new)
    portable = CudaCodecConfig(stream_coder="cpu-zstd")
    runs = []
    for enabled in (True, False):
        monkeypatch.setattr(warp, "enabled", enabled)
        pack = wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=4104, cuda=portable)
        state = clone_state(old)
        report = wt.apply_delta(state, pack, base_version=1)
        assert report.digest_verified
        assert_bits_equal(_cpu(state), _cpu(new))
        runs.append(pack)
    assert runs[0] == runs[1]
    assert runs[0] == wt.encode_delta(_cpu(old), _cpu(new), base_version=1, version=2, chunk_elems=4104)
    if case == "inverted":
        assert any(rec.inverted for rec in read_header(runs[0]).tensors)


def test_warp_kernels_from_ptx_of_an_older_architecture(monkeypatch):
    """A GPU newer than its NVRTC gets PTX of the newest architecture NVRTC knows, which the
    driver compiles for it: pretend this GPU is unknown to NVRTC and compare the packs."""
    from weight_teleport.codec.cuda.kernels import warp
    from weight_teleport.codec.cuda.runtime import nvrtc

    major, minor = torch.cuda.get_device_capability()
    older = [a for a in nvrtc._supported_archs() if a < 10 * major + minor]
    if not older:
        pytest.skip("NVRTC knows no architecture older than this GPU's")
    monkeypatch.setattr(nvrtc, "_supported_archs", lambda: older)
    warp._module.cache_clear()
    try:
        old, new = _pair(5, torch.bfloat16, "density", 0.05, shape=(301, 70))
        pack = wt.encode_delta(
            _cuda(old),
            _cuda(new),
            base_version=1,
            version=2,
            chunk_elems=4104,
            cuda=CudaCodecConfig(stream_coder="cpu-zstd"),
        )
        assert pack == wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=4104)
        state = _cuda(old)
        assert wt.apply_delta(state, pack, base_version=1).digest_verified
        assert_bits_equal(_cpu(state), new)
    finally:
        warp._module.cache_clear()


def test_pinned_ring_rewinds_at_a_call_instead_of_growing():
    """Tables of calls whose copies are still queued behind kernels when the buffer fills:
    rewound at each call's start, the ring keeps its first buffer and delivers every byte."""
    from weight_teleport.codec.cuda.runtime import memory

    ring, n = memory.PinnedRing(), 1 << 20
    first = None
    for call in range(6):
        ring.rewind()
        torch.cuda._sleep(20_000_000)  # the call's copies wait behind this
        outs = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(3)]
        for k, out in enumerate(outs):
            ring.send([np.full(n, 16 * call + k, np.uint8)], out)
        first = ring.buffer.data_ptr() if first is None else first
        torch.cuda.synchronize()
        for k, out in enumerate(outs):
            assert bool((out == 16 * call + k).all())
    assert ring.buffer.data_ptr() == first and ring.buffer.numel() == 4 * n
