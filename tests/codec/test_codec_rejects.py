"""Packs that do not fit raise a typed error and leave the state untouched."""

import struct

import numpy as np
import pytest
import torch
from helpers import assert_bits_equal, clone_state, with_renewed_crcs

import weight_teleport as wt
from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError, UnsupportedFormatError
from weight_teleport.format import read_header


@pytest.fixture(scope="module")
def states():
    g = torch.Generator().manual_seed(0)
    old = {"a": (torch.randn(300, 70, generator=g) * 0.02).to(torch.bfloat16), "b": torch.randn(513, generator=g)}
    new = clone_state(old)
    new["a"].view(-1)[::37] = (new["a"].view(-1)[::37].float() * 1.01).to(torch.bfloat16)
    new["b"][::5] += 1e-3
    return old, new


@pytest.fixture(scope="module")
def pack(states):
    old, new = states
    return wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=4096)


def _rejects(state, pack, error, **kw):
    before = clone_state(state)
    with pytest.raises(error):
        wt.apply_delta(state, pack, **kw)
    assert_bits_equal(state, before)


def test_wrong_base_version_number(states, pack):
    _rejects(clone_state(states[0]), pack, PackMismatchError, base_version=5)


def test_wrong_base_weights(states, pack):
    state = clone_state(states[0])
    state["a"].view(-1)[7] = 3.0
    _rejects(state, pack, PackMismatchError)


@pytest.mark.parametrize("codec", ["sparse", "sparse_ac"])
def test_other_weights_than_the_base_are_named_as_such(states, codec):
    """Weights whose exponents differ from the base's make a sparse chunk's changes not
    fit: the error names the base, not corrupt streams."""
    pack = wt.encode_delta(*states, base_version=1, version=2, chunk_elems=4096, codec=codec)
    g = torch.Generator().manual_seed(9)
    other = {"a": (torch.randn(300, 70, generator=g) * 4).to(torch.bfloat16), "b": states[0]["b"].clone()}
    with pytest.raises(PackMismatchError, match="does not hold the weights of base version 1"):
        wt.apply_delta(clone_state(other), pack)
    with pytest.raises(
        PackFormatError,
        match="likely not the weights of the pack's base "
        r"version 1 \(the base digest check was skipped",
    ):
        wt.apply_delta(clone_state(other), pack, check_base=False)


def test_applied_twice_is_refused(states, pack):
    state = clone_state(states[0])
    wt.apply_delta(state, pack)
    _rejects(state, pack, PackMismatchError)


def test_wrong_names_shapes_dtypes(states, pack):
    old = states[0]
    _rejects({"a": old["a"].clone()}, pack, PackMismatchError)
    _rejects({**clone_state(old), "extra": torch.zeros(3)}, pack, PackMismatchError)
    _rejects({"a": old["a"].clone().reshape(70, 300), "b": old["b"].clone()}, pack, PackMismatchError)
    _rejects({"a": old["a"].clone(), "b": old["b"].to(torch.float64)}, pack, PackMismatchError)


def test_extra_state_tensors_allowed_when_not_strict(states, pack):
    state = {**clone_state(states[0]), "rotary.inv_freq": torch.ones(4)}
    wt.apply_delta(state, pack, strict=False)
    assert_bits_equal({k: state[k] for k in ("a", "b")}, states[1])


@pytest.mark.parametrize("cut", [0, 3, 20, 30, -1, -7])
def test_truncated(states, pack, cut):
    _rejects(clone_state(states[0]), pack[:cut] if cut >= 0 else pack[: len(pack) + cut], PackFormatError)


def test_every_bit_flip_in_a_sample_is_caught(states, pack):
    rng = np.random.default_rng(0)
    state = clone_state(states[0])
    for pos in rng.choice(len(pack), size=60, replace=False):
        bad = bytearray(pack)
        bad[pos] ^= 1 << int(rng.integers(8))
        _rejects(state, bytes(bad), (PackFormatError, PackMismatchError, DigestMismatchError))


def test_unknown_format_version_refused(pack):
    bad = bytearray(pack)
    struct.pack_into("<H", bad, 4, 3)
    with pytest.raises(UnsupportedFormatError, match="version 3"):
        read_header(bytes(bad))


def test_gpu_only_stream_codec_refused_on_cpu(states):
    old, new = states
    pack = wt.encode_delta(old, new, base_version=1, version=2)
    header = read_header(pack)
    header.stream_codecs = ["raw", "nvcomp-ans"]
    from weight_teleport.format import write_pack
    from weight_teleport.format.container import chunk_payload

    chunks = [bytes(chunk_payload(pack, header, c)) for t in header.tensors for c in t.chunks]
    with pytest.raises(UnsupportedFormatError, match="zstd"):
        wt.apply_delta(clone_state(old), write_pack(header, chunks))


def test_which_stream_codecs_each_backend_reads(monkeypatch):
    """The CPU reads raw and zstd; CUDA weights also read lz4 and nvcomp-ans with nvCOMP, and
    without it refuse them naming the install command; a codec no one knows is refused."""
    pytest.importorskip("triton", reason="the CUDA backend needs triton")
    from weight_teleport.codec.cpu import backend as cpu
    from weight_teleport.codec.cuda import backend as cuda
    from weight_teleport.codec.cuda.runtime import nvcomp

    cpu.check_readable(["raw", "zstd"])
    for codec in ("lz4", "nvcomp-ans"):
        with pytest.raises(UnsupportedFormatError, match="stream_coder='huffman'"):
            cpu.check_readable(["raw", codec])
        monkeypatch.setattr(nvcomp, "available", lambda: False)
        with pytest.raises(UnsupportedFormatError, match=r"weight-teleport\[cuda\]"):
            cuda.check_readable(["raw", "zstd", codec])
        monkeypatch.setattr(nvcomp, "available", lambda: True)
        cuda.check_readable(["raw", "zstd", codec])
    with pytest.raises(UnsupportedFormatError, match="brotli"):
        cuda.check_readable(["raw", "brotli"])


def test_cuda_configuration_for_cpu_weights_is_refused(states, pack):
    from weight_teleport.codec.cuda.config import CudaCodecConfig

    old, _ = states
    state = clone_state(old)
    with pytest.raises(ValueError, match="CPU tensors"):
        wt.apply_delta(state, pack, cuda=CudaCodecConfig())
    assert_bits_equal(state, old)


def test_subscriber_refuses_an_unknown_decompression_backend():
    from weight_teleport.subscribe.stager import Stager

    with pytest.raises(ValueError, match="decompress_backend"):
        Stager(None, None, decompress_backend="fpga")


def test_consistent_but_wrong_pack_caught_by_digest(states):
    """A well-formed pack whose promised digest is not what it produces (e.g. an encoder
    bug) is refused before anything is written."""
    old, new = states
    pack = wt.encode_delta(old, new, base_version=1, version=2)
    header = read_header(pack)
    header.tensors[0].digest = "0" * 16
    from weight_teleport.format import write_pack
    from weight_teleport.format.container import chunk_payload

    chunks = [bytes(chunk_payload(pack, header, c)) for t in header.tensors for c in t.chunks]
    _rejects(clone_state(old), write_pack(header, chunks), DigestMismatchError)


def test_snapshot_is_not_a_delta(states):
    with pytest.raises(PackMismatchError):
        wt.decode_snapshot(wt.encode_delta(*states, base_version=0, version=1))


def test_encoder_user_errors(states):
    old, new = states
    with pytest.raises(ValueError, match="names"):
        wt.encode_delta(old, {"a": new["a"]}, base_version=0, version=1)
    with pytest.raises(ValueError, match="shape or dtype"):
        wt.encode_delta(old, {"a": new["a"], "b": new["b"][:10]}, base_version=0, version=1)
    with pytest.raises(ValueError, match="not supported"):
        wt.encode_snapshot({"c": torch.zeros(2, dtype=torch.complex64)}, version=0)
    with pytest.raises(ValueError, match="chunk_elems"):
        wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=12)


@pytest.mark.parametrize("seed", range(40))
def test_corrupt_streams_behind_valid_checksums_are_refused(states, seed):
    """Chunk bytes corrupted after the CRCs were made (a faulty writer): decoders must refuse
    them with a typed error, never crash or write out of bounds, and leave the state as it was."""
    rng = np.random.default_rng(seed)
    old, new = states
    pack = wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=4096)

    def mutate(data: bytearray) -> None:
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(len(data)))
            data[pos] = int(rng.integers(256)) if rng.random() < 0.5 else data[pos] ^ (1 << int(rng.integers(8)))

    bad = with_renewed_crcs(pack, lambda i, data: mutate(data))
    state = clone_state(old)
    try:
        wt.apply_delta(state, bad)
    except (PackFormatError, PackMismatchError, DigestMismatchError):
        assert_bits_equal(state, old)
    else:
        assert_bits_equal(state, new)  # a mutation the format tolerates must still be exact


@pytest.mark.parametrize("kind", ["truncate", "extend", "zero"])
def test_resized_streams_behind_valid_checksums_are_refused(states, kind):
    old, new = states
    pack = wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=4096)
    mutate = {
        "truncate": lambda d: d.__delitem__(slice(len(d) // 2, None)),
        "extend": lambda d: d.extend(b"\x07" * 9),
        "zero": lambda d: d.__setitem__(slice(None), bytes(len(d))),
    }[kind]
    state = clone_state(old)
    with pytest.raises((PackFormatError, PackMismatchError, DigestMismatchError)):
        wt.apply_delta(state, with_renewed_crcs(pack, lambda i, data: mutate(data)))
    assert_bits_equal(state, old)


@pytest.mark.parametrize(
    "classes,inverted,message",
    [
        ([(1, 0)], [], "class map must start at key 0"),
        ([(0, 0), (5, 99)], [], "malformed class map run"),
        ([(0, 0), (5, 10**30)], [], "malformed class map run"),  # past int64
        (None, [7], "inverted class 7 does not exist"),
    ],
)
def test_malformed_class_map_is_refused_naming_its_tensor(states, pack, classes, inverted, message):
    """A header whose class map (or inverted list) of a sparse tensor is malformed, behind a
    valid header CRC: refused with the tensor's name, the state untouched."""
    from weight_teleport.format import write_pack

    h = read_header(pack)
    rec = next(r for r in h.tensors if r.codec == "sparse")
    rec.classes = classes if classes is not None else rec.classes
    rec.inverted = inverted
    bad = write_pack(h, [pack[h.payload_offset :]])
    old, _ = states
    state = clone_state(old)
    with pytest.raises(PackFormatError, match=f"tensor '{rec.name}': {message}"):
        wt.apply_delta(state, bad, base_version=1)
    assert_bits_equal(state, old)


def test_a_state_off_the_cpu_and_cuda_is_refused_by_name(states):
    old, new = states
    meta = {k: torch.empty_like(v, device="meta") for k, v in new.items()}
    with pytest.raises(ValueError, match=r"tensors are on \['cpu', 'meta'\]"):
        wt.encode_delta(old, meta, base_version=1, version=2)
    with pytest.raises(ValueError, match=r"\['meta'\]"):
        wt.encode_snapshot(meta, version=0)
