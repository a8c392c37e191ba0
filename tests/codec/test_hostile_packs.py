"""The decoder is an untrusted-input parser: crafted and fuzzed packs raise typed errors
(weight_teleport.errors), never another exception, leave the target's bits as they were,
and cannot make the decoder allocate more than a small pack's worth of memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_bits_equal, clone_state, with_renewed_crcs
from hostile import chunks_of, frame, framed, header_json, snapshot_u8, with_chunks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weight_teleport as wt
from weight_teleport.codec import tensor_digest
from weight_teleport.codec import digest as D
from weight_teleport.codec.dtypes import BY_NAME
from weight_teleport.errors import PackFormatError, PackLimitError, UnsupportedFormatError, WeightTeleportError
from weight_teleport.format import Group, PackLimits, Stream, read_groups, read_header, write_groups
from weight_teleport.format.checks import DTYPE_BYTES

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def states():
    g = torch.Generator().manual_seed(3)
    old = {
        "a": (torch.randn(5000, generator=g) * 0.02).to(torch.bfloat16),
        "b": torch.randn(40, 30, generator=g),
        "c": torch.arange(300, dtype=torch.int16),
    }
    new = clone_state(old)
    new["a"][::13] = (new["a"][::13].float() * 1.01).to(torch.bfloat16)
    new["b"] += 1e-3  # every element: a dense codec
    return old, new


@pytest.fixture(scope="module")
def delta(states):
    return wt.encode_delta(*states, base_version=1, version=2, chunk_elems=4096)


@pytest.fixture(scope="module")
def snapshot(states):
    return wt.encode_snapshot(states[1], version=2, chunk_elems=4096)


def refused(state: dict, pack: bytes, error=WeightTeleportError, **kw) -> WeightTeleportError:
    """The typed error `apply_delta` raises for `pack`, after checking that it left `state`
    as it was."""
    before = clone_state(state)
    with pytest.raises(error) as e:
        wt.apply_delta(state, pack, **kw)
    assert_bits_equal(state, before)
    return e.value


def test_dtypes_of_the_format_are_the_codecs():
    assert DTYPE_BYTES == {name: d.nbytes for name, d in BY_NAME.items()}


# item 6: zstd frames inflate no further than their header allows


def test_stream_frame_declaring_more_than_its_table_is_refused():
    honest = snapshot_u8(4096)
    lying = frame([(0, 4096)], declared=1 << 30)  # declares a GiB, holds 4096 bytes
    chunk = write_groups([Group(4096, [Stream(1, 4096, lying)])])
    pack = framed(*with_chunks(header_json(honest), {"w": [chunk]}))
    with pytest.raises(PackFormatError, match="declares 1073741824 bytes"):
        wt.decode_snapshot(pack)


def test_header_frame_declaring_more_than_allowed_is_refused(snapshot):
    text = json.dumps(header_json(snapshot), separators=(",", ":")).encode()
    payload = snapshot[read_header(snapshot).payload_offset :]
    big = frame([text, (ord(" "), 64 << 20)], declared=len(text) + (64 << 20))
    with pytest.raises(PackFormatError, match="declares"):
        read_header(framed(text, payload, compress=big))
    small = frame([text, (ord(" "), 1 << 20)], declared=len(text) + (1 << 20))
    assert read_header(framed(text, payload, compress=small)).kind == "snapshot"  # within 4 MiB: any ratio
    with pytest.raises(PackLimitError, match="max_header_bytes"):
        read_header(framed(text, payload, compress=small), limits=PackLimits(max_header_bytes=1 << 20))
    undeclared = frame([text, (ord(" "), 64 << 20)])
    with pytest.raises(PackFormatError, match="holds more than"):
        read_header(framed(text, payload, compress=undeclared))


def test_writer_stores_a_header_that_compresses_too_well_uncompressed():
    """A header the reader would refuse compressed (over 4 MiB, 32 times smaller as a frame)
    is written uncompressed, and reads back."""
    from weight_teleport.format import PackHeader, TensorRecord, write_pack

    recs = [
        TensorRecord(
            name=f"layers.{i}.norm", dtype="bfloat16", shape=(64,), codec="same", digest="1" * 16, base_digest="1" * 16
        )
        for i in range(40_000)
    ]
    pack = write_pack(PackHeader("delta", 2, 1, 4096, recs, ["raw", "zstd"]), [])
    assert pack[6] == 0 and len(read_header(pack).tensors) == 40_000


# item 7: work and memory bounded by the pack's bytes and the caller's limits


def test_more_chunks_than_payload_bytes_are_refused():
    """A chunk holds a byte at least, and chunks do not share bytes: a pack lists no more
    chunks, and no more chunk bytes, than its payload has."""

    def head(n, length):
        rec = {
            "name": "w",
            "dtype": "uint8",
            "shape": [8 * n],
            "codec": "dense_values",
            "digest": "0" * 16,
            "changed": 8 * n,
            "chunks": [[0, length, 0]] * n,
        }
        return {
            "kind": "snapshot",
            "version": 1,
            "base_version": None,
            "chunk_elems": 8,
            "stream_codecs": ["raw"],
            "tensors": [rec],
        }

    with pytest.raises(PackFormatError, match="cannot hold them"):
        read_header(framed(head(1000, 1), b"\0" * 999))
    with pytest.raises(PackFormatError, match="overlap"):
        read_header(framed(head(500, 2), b"\0" * 999))


def test_dense_tensor_larger_than_its_chunks_can_hold_is_refused():
    """A snapshot of 2^36 elements in 16384 one-byte chunks: refused before decode_snapshot
    allocates its 64 GiB."""
    n = 1 << 36
    rec = {"name": "w", "dtype": "uint8", "shape": [n], "codec": "dense_values", "digest": "0" * 16, "changed": n}
    head = {
        "kind": "snapshot",
        "version": 1,
        "base_version": None,
        "chunk_elems": 1 << 22,
        "stream_codecs": ["raw"],
        "tensors": [rec],
    }
    header, payload = with_chunks(head, {"w": [b"\0"] * (n >> 22)})
    with pytest.raises(PackFormatError, match="more than its 16384 stored bytes can hold"):
        wt.decode_snapshot(framed(header, payload))


def test_decode_snapshot_has_a_size_limit():
    """64 MiB of zeros is an honest 10 KB snapshot: refused past the caller's max_bytes,
    decoded within it."""
    pack = wt.encode_snapshot({"z": torch.zeros(1 << 25, dtype=torch.int16)}, version=1)
    assert len(pack) < 32 << 10
    with pytest.raises(PackLimitError, match="max_bytes"):
        wt.decode_snapshot(pack, limits=PackLimits(max_bytes=64 << 20 - 1))
    assert wt.decode_snapshot(pack, limits=PackLimits(max_bytes=64 << 20))["z"].count_nonzero() == 0


def test_max_numel_limits_every_record(states, delta):
    refused(clone_state(states[0]), delta, PackLimitError, limits=PackLimits(max_numel=4999))
    wt.apply_delta(clone_state(states[0]), delta, limits=PackLimits(max_numel=5000))
    with pytest.raises(ValueError, match="max_numel"):
        PackLimits(max_numel=1 << 60)


def test_sparse_chunk_claiming_more_events_than_elements_is_refused(states, delta):
    """Event counts and stream lengths are checked against the chunk's elements before any
    stream is decoded: here 8 events an element, each a valid symbol."""

    def mutate(i, data):
        if i == 0:  # tensor a's first chunk, of 4096 elements: each class claims 8 events an element
            count = 8 * 4096
            streams = [Stream(1, count, frame([(0, count)], declared=count))] + [Stream(0, 0, b"")] * 3
            data[:] = write_groups([Group(count, streams) for _ in read_groups(bytes(data))])

    err = refused(clone_state(states[0]), with_renewed_crcs(delta, mutate), PackFormatError)
    assert "lengths its elements cannot need" in str(err)


# item 8: snapshots hold every element


def test_forged_snapshot_record_of_an_unchanged_tensor_is_refused():
    """A snapshot record with codec `same` and the digest of all-zero bytes: decode_snapshot
    returned uninitialised memory, apply_delta reported success and left the tensor as it was."""
    rec = {
        "name": "w",
        "dtype": "float32",
        "shape": [4],
        "codec": "same",
        "digest": D.to_hex(D.finish(0, 16)),
        "changed": 4,
    }
    pack = framed(
        {
            "kind": "snapshot",
            "version": 1,
            "base_version": None,
            "chunk_elems": 8,
            "stream_codecs": ["raw"],
            "tensors": [rec],
        }
    )
    with pytest.raises(PackFormatError, match="codec 'same'"):
        wt.decode_snapshot(pack)
    refused({"w": torch.ones(4)}, pack, PackFormatError)


@pytest.mark.parametrize("codec", ["sparse", "dense_residual"])
def test_snapshot_of_delta_codecs_is_refused(states, delta, codec):
    obj, chunks = header_json(delta), chunks_of(delta)
    obj.update(kind="snapshot", base_version=None)
    obj["tensors"] = [r for r in obj["tensors"] if "chunks" in r]
    for r in obj["tensors"]:
        r["codec"] = codec
    pack = framed(*with_chunks(obj, chunks))
    with pytest.raises(PackFormatError, match=f"codec '{codec}'"):
        wt.decode_snapshot(pack)
    refused(clone_state(states[0]), pack, PackFormatError, strict=False)


# item 9: typed errors for every malformed field, the spec's limits enforced


def _edit(pack: bytes, edit) -> bytes:
    obj = header_json(pack)
    edit(obj, obj["tensors"][0])
    return framed(obj, pack[read_header(pack).payload_offset :])


@pytest.mark.parametrize(
    "edit, error, message",
    [
        (lambda h, r: r.update(dtype="float128"), UnsupportedFormatError, "dtype 'float128'"),
        (lambda h, r: r.update(codec="brotli_values"), UnsupportedFormatError, "codec 'brotli_values'"),
        (lambda h, r: r.update(shape=[-5000]), PackFormatError, "Expected `int` >= 0 - at `$.tensors[0].shape[0]`"),
        (lambda h, r: r.update(digest="z" * 16), PackFormatError, "not 16 lowercase hex digits"),
        (lambda h, r: r.update(base_digest="AB" * 8), PackFormatError, "not 16 lowercase hex digits"),
        (lambda h, r: r.pop("base_digest"), PackFormatError, "no base_digest"),
        (lambda h, r: r.update(changed=-1), PackFormatError, "Expected `int` >= 0 - at `$.tensors[0].changed`"),
        (lambda h, r: r.update(changed=5001), PackFormatError, "changed elements"),
        (lambda h, r: h.update(chunk_elems=1 << 23), PackFormatError, "at most 4194304"),
        (lambda h, r: h.update(base_version=None), PackFormatError, "base_version"),
        (lambda h, r: h.update(kind="patch"), PackFormatError, "kind"),
    ],
)
def test_malformed_fields_raise_typed_errors(states, delta, edit, error, message):
    for check_base in (True, False):
        err = refused(clone_state(states[0]), _edit(delta, edit), error, check_base=check_base)
        assert message in str(err)


def test_negative_shape_of_a_snapshot_record_is_refused():
    rec = {"name": "w", "dtype": "float32", "shape": [-4], "codec": "dense_values", "digest": "0" * 16}
    with pytest.raises(PackFormatError, match=r"Expected `int` >= 0 - at `\$.tensors\[0\].shape\[0\]`"):
        wt.decode_snapshot(
            framed(
                {
                    "kind": "snapshot",
                    "version": 1,
                    "base_version": None,
                    "chunk_elems": 8,
                    "stream_codecs": [],
                    "tensors": [rec],
                }
            )
        )


@pytest.mark.parametrize("where", ["top", "record"])
def test_deeply_nested_header_is_malformed(where):
    deep = b"[" * 100_000 + b"]" * 100_000
    rec = b'{"name":"a","dtype":"uint8","shape":[1],"codec":"same","digest":"0000000000000000"'
    text = (
        (b'{"x":' + deep + b"}")
        if where == "top"
        else (
            b'{"kind":"snapshot","version":1,"base_version":null,"chunk_elems":8,"stream_codecs":[],"tensors":['
            + rec
            + b',"x":'
            + deep
            + b"}]}"
        )
    )
    with pytest.raises(PackFormatError, match="nested too deeply"):
        read_header(framed(text))


# fuzzing: any header, any chunk bytes

ints = (
    st.sampled_from([0, 1, -1, 7, 8, 4096, 5000, 1 << 22, 1 << 23, 1 << 36, 1 << 63, 1 << 64, -(1 << 63), 10**30])
    | st.integers()
)
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
hex_texts = st.text("0123456789abcdefABCDEF xz", min_size=14, max_size=18)
NEAR = {
    "dtype": st.sampled_from([*DTYPE_BYTES, "float128", "complex64", ""]),
    "codec": st.sampled_from(["same", "sparse", "dense_residual", "dense_values", "zstd", ""]),
    "kind": st.sampled_from(["delta", "snapshot", "anchor"]),
    "digest": hex_texts,
    "base_digest": hex_texts | st.none(),
    "shape": st.lists(ints, max_size=3),
    "chunks": st.lists(st.lists(ints, min_size=2, max_size=4), max_size=3),
    "classes": st.lists(st.lists(ints, min_size=1, max_size=3), max_size=4),
    "inverted": st.lists(ints, max_size=3),
    "stream_codecs": st.lists(st.sampled_from(["raw", "zstd", "lz4", "nvcomp-ans", "brotli"]), max_size=3),
    "version": ints,
    "base_version": ints | st.none(),
    "chunk_elems": ints,
    "changed": ints,
}
"""Values near a field's valid ones (by the field's name), where edge cases live."""


def _paths(node, path=()):
    """Every place in a JSON tree but the numbers inside chunk lists (they would be most of
    the places): the paths to them."""
    out = [path]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        out += [path + (k,)] if k == "chunks" else _paths(v, path + (k,))
    return out


def _mutated(obj: dict, data) -> dict:
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(obj)[1:]))
        node = obj
        for k in path[:-1]:
            node = node[k]
        if isinstance(node, dict) and data.draw(st.integers(0, 5)) == 0:
            node.pop(path[-1])
        else:
            near = NEAR.get(path[-1])
            generic = near is None or data.draw(st.integers(0, 5)) == 0
            node[path[-1]] = data.draw(json_values if generic else near)
    return obj


def _judge(state: dict, pack: bytes) -> None:
    """`pack` applied to `state` and decoded alone: a typed error and `state` unchanged, or
    every tensor the pack names holds the digest it promises."""
    before = clone_state(state)
    try:
        wt.apply_delta(state, pack, strict=False)
    except WeightTeleportError:
        assert_bits_equal(state, before)
    else:
        for rec in read_header(pack).tensors:
            assert tensor_digest(state[rec.name]) == rec.digest
    try:
        for name, t in wt.decode_snapshot(pack, limits=PackLimits(max_bytes=1 << 24)).items():
            assert tensor_digest(t) == next(r.digest for r in read_header(pack).tensors if r.name == name)
    except WeightTeleportError:
        pass


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.data())
def test_fuzzed_headers_raise_typed_errors(states, delta, snapshot, data):
    base = data.draw(st.sampled_from([delta, snapshot]))
    obj = _mutated(header_json(base), data)
    pack = framed(obj, base[read_header(base).payload_offset :], compress=data.draw(st.booleans()))
    _judge(clone_state(states[0]), pack)


@FUZZ
@given(st.data())
def test_fuzzed_chunks_raise_typed_errors(states, delta, snapshot, data):
    """Chunk bytes overwritten, cut or grown, their CRCs renewed: the stream decoders see them."""
    base = data.draw(st.sampled_from([delta, snapshot]))
    n_chunks = sum(len(c) for c in chunks_of(base).values())
    edits = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, n_chunks - 1),
                st.integers(0, 1 << 16),
                st.sampled_from(["set", "cut", "grow"]),
                st.binary(min_size=1, max_size=6),
            ),
            min_size=1,
            max_size=4,
        )
    )

    def mutate(i, buf):
        for chunk, at, how, blob in edits:
            if chunk == i:
                at %= len(buf) + 1
                if how == "set":
                    buf[at : at + len(blob)] = blob
                elif how == "cut":
                    del buf[at : at + len(blob)]
                else:
                    buf[at:at] = blob

    _judge(clone_state(states[0]), with_renewed_crcs(base, mutate))


# bounded memory, measured in child processes

WRAPPER = """
import json, resource, subprocess, sys
run = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": run.returncode, "out": run.stdout, "err": run.stderr[-3000:],
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _peak(mode: str, directory: Path) -> tuple[int, list[dict]]:
    """(peak RSS in KiB of a child decoding the packs of `mode`, its report per pack). The
    child is started by a small Python that reports RUSAGE_CHILDREN: on Linux a process's
    ru_maxrss starts from its parent's peak (kept across exec), and this one's is pytest's."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    run = subprocess.run(
        [sys.executable, "-c", WRAPPER, sys.executable, str(TESTS / "hostile.py"), mode, str(directory)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    report = json.loads(run.stdout)
    assert report["rc"] == 0, report["err"]
    return report["peak_kib"], [json.loads(line) for line in report["out"].splitlines()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_hostile_packs_stay_within_bounded_memory(tmp_path):
    """Packs of 1-33 KB that declared or held 1 GiB zstd frames, 2 million chunks or 32
    million events grew a decoder by 0.4-1.3 GB each; now each is refused with a typed error
    and the decoding process peaks within 200 MB of one that decodes honest packs."""
    import hostile

    hostile.write_packs(tmp_path, hostile.HOSTILE)
    base_dir = tmp_path / "baseline"
    base_dir.mkdir()
    hostile.write_packs(base_dir, hostile.BASELINE)
    baseline, _ = _peak("baseline", base_dir)
    peak, reports = _peak("hostile", tmp_path)
    print(f"peak RSS: honest packs {baseline / 1024:.0f} MB, hostile packs {peak / 1024:.0f} MB", reports)
    assert all(r["bytes"] < 40_000 for r in reports)
    assert [r["error"] for r in reports] == ["PackFormatError"] * len(hostile.HOSTILE), reports
    assert peak < baseline + 200 * 1024, reports
