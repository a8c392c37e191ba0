"""The container and chunk-table layers on their own: pure bytes."""

import dataclasses
import gc
import json
import random
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from weight_teleport import host_memory
from weight_teleport.errors import PackFormatError
from weight_teleport.format import checks, container
from weight_teleport.format import (
    ChunkRef,
    Group,
    PackHeader,
    Stream,
    TensorRecord,
    chunk_payload,
    read_groups,
    read_header,
    write_groups,
    write_pack,
)


def _header(n_tensors=1):
    """A snapshot header of tensors whose chunks are b"abc" each, back to back."""
    recs = [
        TensorRecord(
            name=f"t{i}",
            dtype="bfloat16",
            shape=(4, 4),
            codec="dense_values",
            digest="00" * 8,
            changed=16,
            chunks=[ChunkRef(3 * i, 3, 0x352441C2)],
        )
        for i in range(n_tensors)
    ]
    return PackHeader(kind="snapshot", version=3, base_version=None, chunk_elems=16, tensors=recs)


def test_header_round_trip():
    pack = write_pack(_header(), [b"abc"])
    h = read_header(pack)
    assert h.tensors[0].shape == (4, 4) and h.version == 3 and h.payload_length == 3
    assert bytes(chunk_payload(pack, h, h.tensors[0].chunks[0])) == b"abc"


def test_large_header_is_compressed_and_read_back():
    pack = write_pack(_header(200), [b"abc" * 200])
    assert pack[6] == 1
    assert len(read_header(pack).tensors) == 200


def test_headers_are_built_and_parsed_with_the_collector_paused(monkeypatch):
    """The header's JSON is made and read with the garbage collector paused (its lists never
    reach an older generation) and the collector's state is restored after, also when the
    caller had paused it, and when the header is malformed."""
    seen = []
    decode, encode = container._decode_header, container._encode_json
    monkeypatch.setattr(container, "_decode_header", lambda *a: seen.append(gc.isenabled()) or decode(*a))
    monkeypatch.setattr(container, "_encode_json", lambda *a: seen.append(gc.isenabled()) or encode(*a))
    assert gc.isenabled()
    pack = write_pack(_header(200), [b"abc" * 200])
    assert len(read_header(pack).tensors) == 200
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        read_header(pack)
        assert not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr(container, "_decode_header", lambda *a: decode(b'{"kind": "delta"}'))
    with pytest.raises(PackFormatError, match="malformed"):
        read_header(pack)
    assert gc.isenabled()


def test_pauses_nest_across_threads():
    """Overlapping pauses on two threads: the collector runs again only when the last ends."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def other():
        with host_memory.collections_paused():
            entered.set()
            release.wait()

    t = threading.Thread(target=other)
    with host_memory.collections_paused():
        t.start()
        entered.wait()
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join()
    assert gc.isenabled()


def test_codec_calls_run_with_the_collector_paused(monkeypatch):
    """encode, stage and apply each run with the collector paused (their temporaries die
    unpromoted), which is running again after each, also after an error."""
    import torch

    import weight_teleport as wt
    from weight_teleport.codec import api
    from weight_teleport.codec.cpu import backend as cpu

    seen = []
    spy = lambda fn: lambda *a, **k: seen.append((fn.__name__, gc.isenabled())) or fn(*a, **k)
    for mod, name in ((api, "write_pack"), (api, "read_header"), (cpu, "_apply")):
        monkeypatch.setattr(mod, name, spy(getattr(mod, name)))
    old = {"w": torch.arange(64, dtype=torch.float32)}
    new = {"w": old["w"] + 1}
    pack = wt.encode_delta(old, new, base_version=0, version=1)
    assert gc.isenabled()
    wt.apply_delta(old, pack)
    assert torch.equal(old["w"], new["w"]) and gc.isenabled()
    with pytest.raises(PackFormatError):
        wt.stage_delta(old, pack[:-1])
    assert gc.isenabled()
    assert [n for n, _ in seen] == ["write_pack", "read_header", "_apply", "read_header"]
    assert not any(on for _, on in seen)


@pytest.mark.parametrize("crc", [-1, 1 << 32, 10**30])
def test_chunk_crc_out_of_range_is_refused(crc):
    """A header whose chunk CRC-32 is not a 32-bit value is refused as malformed (readers
    hold CRCs in fixed-width integers)."""
    h = _header()
    h.tensors[0].chunks = [ChunkRef(0, 3, crc)]
    with pytest.raises(PackFormatError, match="CRC-32 out of range"):
        read_header(write_pack(h, [b"abc"]))


def _with_header(obj: dict, payload: bytes = b"abc") -> bytes:
    """A pack whose header is the JSON of `obj`, uncompressed."""
    head = json.dumps(obj).encode()
    pre = container.PREAMBLE.pack(
        container.MAGIC, container.FORMAT_VERSION, 0, len(head), zlib.crc32(head), len(payload)
    )
    return pre + head + payload


def _header_obj() -> dict:
    pack = write_pack(_header(), [b"abc"])
    return json.loads(pack[container.PREAMBLE.size : len(pack) - 3])


@pytest.mark.parametrize(
    "path, value",
    [
        (("version",), "3"),
        (("version",), 3.0),
        (("chunk_elems",), True),
        (("base_version",), [1]),
        (("tensors",), {}),
        (("tensors", 0), [1]),
        (("tensors", 0, "name"), 7),
        (("tensors", 0, "shape"), [4, "4"]),
        (("tensors", 0, "shape"), 16),
        (("tensors", 0, "changed"), None),
        (("tensors", 0, "chunks", 0), [0, 3]),
        (("tensors", 0, "chunks", 0), {"offset": 0}),
        (("tensors", 0, "classes"), [[0, 0, 0]]),
        (("tensors", 0, "inverted"), [0.5]),
        (("stream_codecs",), "raw"),
    ],
)
def test_header_fields_of_the_wrong_type_are_refused(path, value):
    """Every field of the header is read with its type checked: a wrong one is a
    PackFormatError that names where it is, never another exception or a record that holds it."""
    obj = _header_obj()
    read_header(_with_header(obj))  # the unmodified header reads
    node = obj
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(PackFormatError, match="malformed"):
        read_header(_with_header(obj))


def test_header_fields_unknown_to_the_reader_are_ignored():
    obj = _header_obj()
    obj["written_by"] = "a later writer"
    obj["tensors"][0]["note"] = {"any": [1, 2]}
    assert read_header(_with_header(obj)).tensors[0].shape == (4, 4)


def test_header_needs_only_its_prefix():
    pack = write_pack(_header(), [b"abc"])
    h = read_header(pack[:-3], total_length=len(pack))
    assert h.payload_offset == len(pack) - 3


def test_corrupt_chunk_detected():
    pack = bytearray(write_pack(_header(), [b"abc"]))
    pack[-1] ^= 0x40
    h = read_header(bytes(pack))
    with pytest.raises(PackFormatError, match="corrupted"):
        chunk_payload(bytes(pack), h, h.tensors[0].chunks[0])


def test_chunk_outside_payload_refused():
    header = _header()
    header.tensors[0].chunks = [ChunkRef(1, 3, 0)]
    with pytest.raises(PackFormatError, match="outside"):
        read_header(write_pack(header, [b"abc"]))


def test_bad_magic_refused():
    with pytest.raises(PackFormatError, match="magic"):
        read_header(b"NOPE" + bytes(40))


def test_groups_round_trip():
    groups = [Group(3, [Stream(0, 2, b"xy"), Stream(1, 100, b"zzz")]), Group(0, []), Group(1 << 40, [])]
    out = read_groups(write_groups(groups))
    assert [(g.count, [(s.codec, s.raw_len, bytes(s.data)) for s in g.streams]) for g in out] == [
        (3, [(0, 2, b"xy"), (1, 100, b"zzz")]),
        (0, []),
        (1 << 40, []),
    ]


@pytest.mark.parametrize("bad", [b"", b"\x01", b"\x01\x01\x01\x00\x05\x05", b"\x01\x00\x00extra"])
def test_malformed_groups_refused(bad):
    with pytest.raises(PackFormatError):
        read_groups(bad)


parts = st.lists(st.binary(max_size=300).map(lambda b: [b, bytearray(b), memoryview(b)]), max_size=12)


@settings(max_examples=100, deadline=None)
@given(parts, st.integers(0, 2))
def test_threaded_join_writes_the_same_bytes(parts, kind):
    """A large pack is filled by threads into a new bytes object: the same bytes as a plain
    join, whatever the parts' sizes, types and the threads' spans across them."""
    chunks = [p[kind] for p in parts]
    threshold = host_memory.THREADED_FILL_FROM
    try:
        host_memory.THREADED_FILL_FROM = 0  # the threads' spans, however small the parts
        out = host_memory.join(chunks)
    finally:
        host_memory.THREADED_FILL_FROM = threshold
    assert type(out) is bytes and out == b"".join(chunks)


def test_threaded_join_of_a_large_pack():
    payload = np.random.default_rng(0).integers(0, 256, host_memory.THREADED_FILL_FROM + 12345, np.uint8)
    chunks = [memoryview(payload)[i : i + (1 << 20)] for i in range(0, payload.size, 1 << 20)]
    header = _header()
    header.tensors[0].chunks = [ChunkRef(0, 3, 0)]
    pack = write_pack(header, chunks)
    h = read_header(pack)
    assert type(pack) is bytes and pack[h.payload_offset :] == payload.tobytes()


@pytest.mark.parametrize(
    "sizes,threshold",
    [([5], None), ([0], None), ([3, 0, 7, 1], None), ([40_000], 1 << 10), ([1000, 30_000, 17], 1 << 10)],
)
def test_fill_copies_parts_end_to_end(sizes, threshold, monkeypatch):
    """`fill` writes its parts end to end: one small part in one copy, several parts (or a
    part past the threshold) in spans, on threads from the threshold on."""
    if threshold:
        monkeypatch.setattr(host_memory, "THREADED_FILL_FROM", threshold)
    rng = np.random.default_rng(sum(sizes))
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    parts[0] = bytes(parts[0])  # any bytes-like part
    dst = np.zeros(sum(sizes), np.uint8)
    host_memory.fill(dst, parts, threads=4)
    assert dst.tobytes() == b"".join(bytes(p) for p in parts)
    with pytest.raises(AssertionError):
        host_memory.fill(np.zeros(sum(sizes) + 1, np.uint8), parts)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=30),
            st.lists(st.integers(0, 2**40), max_size=4),
            st.integers(0, 40),
            st.integers(0, 16),
            st.integers(0, 4),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_prefix_bound_covers_any_header_of_the_records(specs):
    """The room the CUDA encoder leaves before its payload: at least the preamble and the
    stored header, whatever the chunk references and the header's other fields hold."""
    records = [
        TensorRecord(
            name=name,
            dtype="float64",
            shape=tuple(shape),
            codec="sparse",
            digest="f" * 16,
            base_digest="e" * 16,
            changed=2**62,
            classes=[(k, k % 16) for k in range(0, 50 * runs, 50)],
            inverted=list(range(inv)),
        )
        for name, shape, runs, inv, _ in specs
    ]
    bound = container.prefix_bound(records, sum(s[-1] for s in specs))
    for rec, spec in zip(records, specs):
        rec.chunks = [ChunkRef(2**63 - 1, 2**63 - 1, 0xFFFFFFFF)] * spec[-1]
    header = PackHeader(
        kind="snapshot",
        version=2**63 - 1,
        base_version=2**63 - 1,
        chunk_elems=1 << 22,
        tensors=records,
        stream_codecs=["raw", "zstd", "nvcomp_ans"],
    )
    assert len(container._prefix(header, 2**63 - 1)) <= bound


def _three_chunk_pack(seed: int, n: int):
    """(random payload of n bytes, a header of three tensors whose 1000-byte chunks start
    it, write_pack's bytes of the two)."""
    payload = np.random.default_rng(seed).integers(0, 256, n, np.uint8)
    header = _header(3)
    for i, rec in enumerate(header.tensors):
        rec.chunks = [ChunkRef(1000 * i, 1000, zlib.crc32(payload[1000 * i : 1000 * (i + 1)]))]
    return payload, header, write_pack(header, [payload])


def test_pack_written_around_a_payload_with_room_before_it():
    """write_pack_into: the bytes write_pack gives; around a payload that is a view with room
    before it in a larger array, in place (the payload not copied), else copied into memory
    from `empty`."""
    payload, header, expected = _three_chunk_pack(1, 5000)
    room = container.prefix_bound(_header(3).tensors, 3)
    whole = np.zeros(room + payload.size + 16, np.uint8)
    whole[room : room + payload.size] = payload
    empty = lambda n: np.zeros(n, np.uint8)
    got = container.write_pack_into(header, [whole[room : room + payload.size]], empty)
    assert got.tobytes() == expected and np.shares_memory(got, whole)
    whole[5 : 5 + payload.size] = payload
    for chunks in (
        [whole[5 : 5 + payload.size]],
        [bytes(payload)],
        [payload[:10], memoryview(payload)[10:]],
        [payload],
    ):
        got = container.write_pack_into(header, chunks, empty)
        assert got.tobytes() == expected and not np.shares_memory(got, whole) and not np.shares_memory(got, payload)


def test_pack_written_into_waits_for_its_payload():
    """write_pack_into calls `ready` before it reads the chunks or returns them: a payload
    still being copied into place (here, written by `ready`) is the one in the pack, in
    place and copied."""
    payload, header, expected = _three_chunk_pack(2, 3000)
    room = container.prefix_bound(_header(3).tensors, 3)
    for at in (room, 5):  # written around the payload; copied, the room being too small
        whole = np.zeros(room + payload.size, np.uint8)
        view = whole[at : at + payload.size]

        def ready():
            view[:] = payload

        got = container.write_pack_into(header, [view], lambda n: np.zeros(n, np.uint8), ready)
        assert got.tobytes() == expected and np.shares_memory(got, whole) == (at == room)


_field = st.one_of(st.integers(-2, 40), st.sampled_from([2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.tuples(_field, _field, _field), min_size=1, max_size=3), min_size=1, max_size=5),
    st.integers(0, 30),
    st.randoms(use_true_random=False),
)
@example([[(0, 1, 2**32)]], 5, random.Random(0))
@example([[(0, 1, 7)], [(1, 2, 2**32 - 1), (2**63, 0, 0)]], 5, random.Random(0))
@example([[(3, 2, 0)]], 4, random.Random(0))
@example([[(-1, 1, 0)]], 5, random.Random(0))
@example([[(2, -1, 0)]], 5, random.Random(0))
@example([[(0, 1, -1)]], 5, random.Random(0))
def test_chunk_table_is_checked_at_once_as_chunk_by_chunk(chunks, payload, rnd):
    """read_header checks every chunk over all chunks at once: it refuses a header exactly
    when the chunk-by-chunk check does, with its message (chunks outside the payload or empty,
    CRC-32s out of range, numbers past int64, chunks longer together than the payload), and keeps the chunks as rows that ChunkSpans.of
    takes for any records in any order."""
    recs = [
        TensorRecord(
            name=f"t{i}",
            dtype="uint8",
            shape=(len(c) * 8,),
            codec="dense_values",
            digest="00" * 8,
            chunks=[ChunkRef(*x) for x in c],
        )
        for i, c in enumerate(chunks)
    ]
    header = PackHeader(kind="snapshot", version=1, base_version=None, chunk_elems=8, tensors=recs)
    pack = write_pack(header, [bytes(payload)])
    if sum(map(len, chunks)) > payload:  # refused from the count alone, before the rows are made
        with pytest.raises(PackFormatError, match="cannot hold them"):
            read_header(pack)
        return
    want = None
    try:
        checks.check_chunks_one_by_one(dataclasses.replace(header, payload_length=payload))
    except PackFormatError as e:
        want = str(e)
    if want is not None:
        with pytest.raises(PackFormatError) as e:
            read_header(pack)
        assert str(e.value) == want
        return
    h = read_header(pack)
    np.testing.assert_array_equal(h.chunk_rows, np.array([x for c in chunks for x in c], np.int64).reshape(-1, 3))
    some = rnd.sample(h.tensors, rnd.randint(0, len(h.tensors)))
    spans = container.ChunkSpans.of(h, some)
    rows = np.array([x for r in some for x in r.chunks], np.int64).reshape(-1, 3)
    np.testing.assert_array_equal(spans.starts, rows[:, 0] + h.payload_offset)
    np.testing.assert_array_equal(spans.lengths, rows[:, 1])
    np.testing.assert_array_equal(spans.crcs, rows[:, 2])


def test_the_packages_names_load_on_first_use():
    """`weight_teleport.format` and `.pipeline` list their names (`dir`) without loading
    numpy or torch, load a name's module when it is first used, and refuse unknown names."""
    code = (
        "import sys, weight_teleport.format as f, weight_teleport.publish as p\n"
        "assert 'read_header' in dir(f) and 'Publisher' in dir(p)\n"
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
        "assert f.PackLimits.__name__ == 'PackLimits'\n"
        "try:\n    f.nothing\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
