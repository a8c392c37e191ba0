"""Codec `sparse_ac`: the adaptive range coder's round trips (kernels and packs, on random
and adversarial inputs), its golden bytes, and its refusal of malformed chunks."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import DTYPES, assert_bits_equal, clone_state, with_renewed_crcs
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codec_roundtrip import make_pair
from test_format_golden import _states

import weight_teleport as wt
from weight_teleport.codec.cpu import adaptive as A
from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.format import read_header
from weight_teleport.format.codecs import pick

U64 = np.uint64
MAX_GAP = (1 << 22) - 1


def _code(classes, bits: int):
    """encode_classes then decode_classes of `classes`, a list of (inverted, gaps,
    residuals): (coded bytes, decoded gaps, decoded residuals, decoder's verdict)."""
    ev = np.array([len(g) for _, g, _ in classes], np.int64)
    rc = np.array([len(r) for _, _, r in classes], np.int64)
    inv = np.array([i for i, _, _ in classes], np.bool_)
    gaps = np.array([x for _, g, _ in classes for x in g], np.int64)
    res = np.array([x for _, _, r in classes for x in r], np.uint64)
    off = lambda c: np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)  # noqa: E731
    wmask = U64((1 << bits) - 1)
    room = 16
    while True:
        out = np.empty(room, np.uint8)
        n = A.encode_classes(gaps, off(ev), ev, res, off(rc), rc, inv, U64(1 << (bits - 1)), wmask, out)
        if n >= 0:
            break
        room *= 2  # the retry path is part of what is tested
    data = out[:n].copy()
    g2, r2 = np.empty_like(gaps), np.empty_like(res)
    ok = A.decode_classes(data, off(ev), ev, off(rc), rc, inv, wmask, g2, r2)
    return data, (gaps, g2), (res, r2), ok


def _residuals(bits: int):
    top = (1 << bits) - 1
    edges = [1, top, 1 << (bits - 1), (1 << (bits - 1)) - 1, (1 << (bits - 1)) + 1, 2, top - 1]
    return st.one_of(st.sampled_from(edges), st.integers(1, top))


@st.composite
def _classes(draw):
    bits = draw(st.sampled_from([8, 16, 32, 64]))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        inverted = draw(st.booleans())
        gaps = draw(st.lists(st.one_of(st.integers(0, 3), st.integers(0, MAX_GAP), st.just(MAX_GAP)), max_size=40))
        n_res = draw(st.integers(0, 40)) if inverted else len(gaps)
        out.append((inverted, gaps, draw(st.lists(_residuals(bits), min_size=n_res, max_size=n_res))))
    return bits, out


@settings(max_examples=300, deadline=None)
@given(case=_classes())
def test_coder_round_trips_any_gaps_and_residuals(case):
    bits, classes = case
    data, gaps, res, ok = _code(classes, bits)
    assert ok
    assert np.array_equal(*gaps) and np.array_equal(*res)
    assert data.size == 0 or data[-1] != 0  # the writer drops the zeros a reader pads with


def test_coder_round_trips_long_skewed_streams():
    """Many events (carries through long runs of 0xFF bytes, probabilities at their limits)."""
    rng = np.random.default_rng(0)
    cases = [
        (False, [0] * 50_000, [1] * 50_000),
        (True, [MAX_GAP] * 300, list(rng.integers(1, 1 << 16, 30_000))),
        (False, list(rng.geometric(0.003, 20_000) - 1), list(rng.choice([1, 65535, 2, 65534], 20_000))),
    ]
    for case in cases:
        _, gaps, res, ok = _code([case], 16)
        assert ok and np.array_equal(*gaps) and np.array_equal(*res)


@pytest.mark.parametrize("bits", [8, 16, 64])
def test_decoder_refuses_codes_no_encoder_writes(bits):
    """Bytes past the stream and a first word of ones are refused; arbitrary bytes are
    refused or decode to values an encoder writes (gaps below 2^22, residuals of the width,
    never 0), which code back to the same values."""
    data, _, _, _ = _code([(False, [5, 7], [1, 2])], bits)
    wmask = U64((1 << bits) - 1)
    one = np.array([0], np.int64), np.array([2], np.int64)

    def decodes(stream) -> bool:
        g, r = np.empty(2, np.int64), np.empty(2, np.uint64)
        ok = A.decode_classes(
            np.asarray(stream, np.uint8), one[0], one[1], one[0], one[1], np.array([False]), wmask, g, r
        )
        if ok:  # what it accepts are values an encoder codes back to the same values
            assert (g < (1 << 22)).all() and (r != 0).all() and (r <= wmask).all()
            _, regaps, reres, again = _code([(False, list(g), list(r))], bits)
            assert again and np.array_equal(*regaps) and np.array_equal(*reres)
        return ok

    assert decodes(data)
    assert not decodes(np.concatenate([data, [1] * 8]))  # past what the decoder reads
    assert not decodes([0xFF] * 8)
    rng = np.random.default_rng(bits)
    verdicts = [decodes(rng.integers(0, 256, int(rng.integers(0, 12)))) for _ in range(300)]
    assert 0 < sum(verdicts) < len(verdicts)  # arbitrary bytes: some decode, some are refused


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 33), min_size=0, max_size=3).map(tuple),
    base=st.sampled_from(["weights", "random"]),
    mode=st.sampled_from(["none", "single", "density", "all"]),
    change=st.sampled_from(["ulp", "random", "specials"]),
    p=st.sampled_from([0.003, 0.05, 0.5, 0.95]),
    chunk=st.sampled_from([8, 24, 1 << 22]),
)
def test_adaptive_pack_round_trip(seed, dtype, shape, base, mode, change, p, chunk):
    old, new = make_pair(seed, dtype, shape, base, mode, change, p)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=3, version=4, chunk_elems=chunk, codec="sparse_ac")
    assert all(t.codec in ("same", "sparse_ac", "dense_residual", "dense_values") for t in read_header(pack).tensors)
    state = {"w": old.clone()}
    report = wt.apply_delta(state, pack, base_version=3)
    assert_bits_equal(state, {"w": new})
    assert report.digest_verified


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=4),
    n=st.integers(1, 3000),
    ps=st.lists(st.sampled_from([0.0005, 0.005, 0.01, 0.02, 0.3, 0.95]), min_size=4, max_size=4),
    chunk=st.sampled_from([24, 1024, 1 << 22]),
)
def test_auto_packs_round_trip_with_the_codec_each_records_counts_pick(seed, dtypes, n, ps, chunk):
    olds, news = {}, {}
    for i, (dtype, p) in enumerate(zip(dtypes, ps)):
        olds[f"t{i}"], news[f"t{i}"] = make_pair(seed + i, dtype, (n,), "weights", "density", "random", p)
    pack = wt.encode_delta(olds, news, base_version=3, version=4, chunk_elems=chunk, codec="auto")
    for t in read_header(pack).tensors:
        if t.codec in ("sparse", "sparse_ac"):
            assert t.codec == pick("auto", t.changed, n)
    state = clone_state(olds)
    wt.apply_delta(state, pack, base_version=3)
    assert_bits_equal(state, news)


def test_adaptive_packs_are_smaller_on_weight_like_steps():
    """bf16 copies of fp32 masters before and after a small step (~0.5% of them change): where
    real training steps live."""
    g = torch.Generator().manual_seed(3)
    master = torch.randn(512, 512, generator=g) * 0.02
    old = master.to(torch.bfloat16)
    new = (master + 2e-7 * torch.randn(512, 512, generator=g)).to(torch.bfloat16)
    assert 0.001 < (old != new).float().mean() < 0.02
    sizes = {
        c: len(wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, codec=c))
        for c in ("sparse", "sparse_ac")
    }
    assert sizes["sparse_ac"] < sizes["sparse"]


CODEC_GOLDEN = {"sparse_ac": (537, "a961ee9541b19812ce6383183a500ffe12772eac4e19cd8a21bf39ea0ff9fc47")}
"""(length, sha256) of the `sparse_ac` pack of test_format_golden's states that every backend
writes (tests/codec/test_conformance.py holds each backend to it)."""
GOLDEN = ["020003012280", "02000108", "0200010a"]
"""The chunks of the delta of test_format_golden's states: the class table (2 classes,
their events), then the coded stream."""


def _golden_states():
    """test_format_golden's states, tensor "w" alone."""
    old, new = _states()
    return {"w": old["w"]}, {"w": new["w"]}


def _chunks(pack: bytes) -> list[str]:
    h = read_header(pack)
    return [
        bytes(pack[h.payload_offset + r.offset : h.payload_offset + r.offset + r.length]).hex()
        for r in h.tensors[0].chunks
    ]


def test_golden_chunks():
    """The exact chunk bytes of a small `sparse_ac` delta: a change here is a format change."""
    old, new = _golden_states()
    pack = wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=8, codec="sparse_ac")
    assert read_header(pack).tensors[0].codec == "sparse_ac"
    assert _chunks(pack) == GOLDEN


@pytest.fixture(scope="module")
def states():
    old, new = make_pair(21, torch.bfloat16, (96, 80), "weights", "density", "ulp", 0.02)
    inv_old, inv_new = make_pair(22, torch.float32, (4000,), "weights", "density", "ulp", 0.9)
    return {"w": old, "v": inv_old}, {"w": new, "v": inv_new}


@pytest.mark.parametrize("seed", range(12))
def test_corrupt_chunks_behind_valid_checksums_are_refused(states, seed):
    rng = np.random.default_rng(seed)
    old, new = states
    pack = wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=2048, codec="sparse_ac")

    def mutate(data: bytearray) -> None:
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(len(data)))
            data[pos] = int(rng.integers(256)) if rng.random() < 0.5 else data[pos] ^ (1 << int(rng.integers(8)))

    state = clone_state(old)
    try:
        wt.apply_delta(state, with_renewed_crcs(pack, lambda i, data: mutate(data)))
    except (PackFormatError, PackMismatchError, DigestMismatchError):
        assert_bits_equal(state, old)
    else:
        assert_bits_equal(state, new)


@pytest.mark.parametrize("kind", ["truncate", "extend", "zero", "one_byte", "counts"])
def test_resized_or_miscounted_chunks_are_refused(states, kind):
    old, _ = states
    pack = wt.encode_delta(old, states[1], base_version=1, version=2, chunk_elems=2048, codec="sparse_ac")
    mutate = {
        "truncate": lambda d: d.__delitem__(slice(len(d) // 2, None)),
        "extend": lambda d: d.extend(b"\x07" * 9),
        "zero": lambda d: d.__setitem__(slice(None), bytes(len(d))),
        "one_byte": lambda d: d.__delitem__(slice(1, None)),
        "counts": lambda d: d.__setitem__(slice(1, 4), b"\xff\xff\x7f"),
    }[kind]
    state = clone_state(old)
    with pytest.raises((PackFormatError, PackMismatchError, DigestMismatchError)):
        wt.apply_delta(state, with_renewed_crcs(pack, lambda i, data: mutate(data)))
    assert_bits_equal(state, old)


def test_unknown_codec_is_refused():
    old, new = _golden_states()
    with pytest.raises(ValueError, match="unknown codec 'ans' .* choose one of 'sparse', 'sparse_ac'"):
        wt.encode_delta(old, new, base_version=0, version=1, codec="ans")
    with pytest.raises(ValueError, match=r"unknown codec 'adaptive' .*\('adaptive' was a coder: codec='sparse_ac'\)"):
        wt.encode_delta(old, new, base_version=0, version=1, codec="adaptive")
    with pytest.raises(ValueError, match="unknown coder 'ans'"):
        wt.encode_delta(old, new, base_version=0, version=1, coder="ans")


@pytest.mark.parametrize("coder,codec", [("zstd", "sparse"), ("adaptive", "sparse_ac")])
def test_the_deprecated_coder_still_picks_its_codec(coder, codec):
    """`coder=` (the choice's old spelling) warns and writes the pack `codec=` writes."""
    old, new = _golden_states()
    with pytest.warns(DeprecationWarning, match=f"coder='{coder}' is deprecated: use codec='{codec}'") as caught:
        pack = wt.encode_delta(old, new, base_version=0, version=1, coder=coder)
    assert caught[0].filename == __file__  # the warning points at the caller
    assert pack == wt.encode_delta(old, new, base_version=0, version=1, codec=codec)
    with pytest.raises(ValueError, match="give codec='sparse_ac' alone"):
        wt.encode_delta(old, new, base_version=0, version=1, codec="sparse_ac", coder="zstd")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype,density",
    [
        (torch.bfloat16, 0.003),
        (torch.bfloat16, 0.05),
        (torch.float32, 0.9),
        (torch.float16, 0.3),
        (torch.int8, 0.5),
        (torch.float64, 0.02),
    ],
)
def test_cuda_stages_adaptive_packs_bit_exact(dtype, density):
    """`sparse_ac` packs written by the CUDA encoder: byte-identical to the CPU's; staged onto
    CUDA weights: the new weights, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    old, new = make_pair(4, dtype, (300, 97), "weights", "density", "ulp", density)
    olds, news = {"w": old, "r": old.flip(0)}, {"w": new, "r": new.flip(0)}
    pack = wt.encode_delta(olds, news, base_version=0, version=1, chunk_elems=4096, codec="sparse_ac")
    on_gpu = {k: v.cuda() for k, v in olds.items()}
    gpu_pack = wt.encode_delta(
        on_gpu, {k: v.cuda() for k, v in news.items()}, base_version=0, version=1, chunk_elems=4096, codec="sparse_ac"
    )
    assert bytes(gpu_pack) == pack
    wt.apply_staged(on_gpu, wt.stage_delta(on_gpu, pack))
    assert_bits_equal({k: v.cpu() for k, v in on_gpu.items()}, news)


@pytest.mark.cuda
def test_cuda_refuses_corrupt_adaptive_chunks():
    """Corrupt chunks behind renewed CRCs: refused with the CUDA weights untouched (or exact)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    old, new = make_pair(5, torch.bfloat16, (200, 64), "weights", "density", "ulp", 0.02)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=1024, codec="sparse_ac")
    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(20):

        def mutate(i, data):
            data[int(rng.integers(len(data)))] = int(rng.integers(256))

        state = {"w": old.cuda()}
        try:
            wt.apply_staged(state, wt.stage_delta(state, with_renewed_crcs(pack, mutate)))
        except (PackFormatError, PackMismatchError, DigestMismatchError):
            refused += 1
            assert_bits_equal({"w": state["w"].cpu()}, {"w": old})
        else:
            assert_bits_equal({"w": state["w"].cpu()}, {"w": new})
    assert refused >= 10


DECODER_SIGNATURE = dict(
    buf_ptr="*u8",
    start_ptr="*i64",
    end_ptr="*i64",
    ev_ptr="*i64",
    res_cnt_ptr="*i64",
    res_start_ptr="*i64",
    inv_ptr="*i8",
    seg_word_ptr="*i64",
    top_bit="i64",
    bitmap_ptr="*i32",
    last_ptr="*i64",
    res_ptr="*i64",
    n_res="i64",
    bad_ptr="*i8",
)
ENCODER_SIGNATURE = dict(
    ranks_ptr="*i32",
    res_ptr="*i16",
    ev_ptr="*i64",
    ev_start_ptr="*i64",
    res_cnt_ptr="*i64",
    res_start_ptr="*i64",
    inv_ptr="*i8",
    out_ptr="*u8",
    room_at_ptr="*i64",
    room_ptr="*i64",
    len_ptr="*i64",
    need_ptr="*i64",
)


RANGE_CODERS = [(side, bits) for bits in (8, 16, 32, 64) for side in ("decoder", "encoder")]


def range_coder_ptx(side: str, bits: int) -> str:
    """The PTX of the Triton range coder's `side` for elements of `bits` bits, compiled for
    compute capability 9.0 (no GPU needed); in a process whose kernels are compiled."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from weight_teleport.codec.cuda.kernels import encode_adaptive, stage_adaptive

    kernel, signature = (
        (stage_adaptive._chunk_kernel, dict(DECODER_SIGNATURE))
        if side == "decoder"
        else (encode_adaptive._chunk_kernel, dict(ENCODER_SIGNATURE, res_ptr=f"*i{bits}"))
    )
    signature.update(NCP="constexpr", BITS="constexpr")
    src = ASTSource(fn=kernel, signature=signature, constexprs={"NCP": 16, "BITS": bits})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]


@pytest.fixture(scope="module")
def range_coders_compiled() -> dict:
    """{(side, bits): whether its PTX holds the kernel}. Triton reads its interpreter mode
    when a kernel (its own library's too) is defined, so where this process runs the
    interpreter (tests/conftest.py, without a GPU) the compiler runs in a process of its own,
    all of them in one."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        return {(s, b): "_chunk_kernel" in range_coder_ptx(s, b) for s, b in RANGE_CODERS}
    tests = Path(__file__).resolve().parents[1]
    code = (
        "import folders, test_codec_adaptive as t\n"
        "print({(s, b): '_chunk_kernel' in t.range_coder_ptx(s, b) for s, b in t.RANGE_CODERS})"
    )
    path = os.pathsep.join([str(tests), str(tests.parent), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("side,bits", RANGE_CODERS)
def test_gpu_range_coder_compiles_for_the_h200(side, bits, range_coders_compiled):
    """The Triton range coder compiles to PTX for compute capability 9.0 (no GPU needed): a
    construct the interpreter runs but the compiler refuses fails here, not only on a GPU."""
    assert range_coders_compiled[side, bits]


def test_publish_command_with_codec_sparse_ac(tmp_path, capsys):
    """`weight-teleport publish --codec sparse_ac`: the delta's records are `sparse_ac`, and
    `pull` gives the published weights bit for bit. The deprecated `--coder adaptive`
    publishes the same, and says so."""
    from safetensors.torch import load_file, save_file

    from weight_teleport.cli import main
    from weight_teleport.format.manifest import from_json
    from weight_teleport.store import open_store

    g = torch.Generator().manual_seed(0)
    master = torch.randn(256, 512, generator=g) * 0.02
    ckpt, url = tmp_path / "ckpt", f"file://{tmp_path}/store"
    ckpt.mkdir()
    versions = [master + 2e-6 * k * torch.randn(256, 512, generator=g) for k in range(3)]
    flags = [["--codec", "sparse_ac"], ["--codec", "sparse_ac"], ["--coder", "adaptive"]]
    for w, flag in zip(versions, flags):
        save_file({"w": w.to(torch.bfloat16)}, str(ckpt / "model.safetensors"))
        assert main(["publish", str(ckpt), "--to", url, *flag]) == 0
    assert "--coder adaptive is deprecated: use --codec sparse_ac" in capsys.readouterr().err
    with open_store(url) as store:
        deltas = [e for e in from_json(store.get_manifest()).entries if e.kind == "delta"]
        assert [e.version for e in deltas] == [1, 2]
        assert all(read_header(store.get(e.key)).tensors[0].codec == "sparse_ac" for e in deltas)
    assert main(["pull", url, "--out", str(tmp_path / "out"), "--version", "2"]) == 0
    got = load_file(str(tmp_path / "out" / "model.safetensors"))["w"]
    assert torch.equal(got.view(torch.int16), versions[2].to(torch.bfloat16).view(torch.int16))
