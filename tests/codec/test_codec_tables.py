"""The vectorised reader of sparse chunks' stream tables (codec/cuda/kernels/stream_tables.py, numpy only)
against the format's own reader."""

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_codec_roundtrip import make_pair

import weight_teleport as wt
from weight_teleport.codec.cuda.kernels import stream_tables
from weight_teleport.errors import PackFormatError
from weight_teleport.format import read_groups, read_header
from weight_teleport.format.groups import _put_varint, read_varint


def _sparse_refs(pack: bytes):
    header = read_header(pack)
    refs = [(t, ref) for t in header.tensors if t.codec == "sparse" for ref in t.chunks]
    k = np.array([max(c for _, c in t.classes) + 1 for t, _ in refs], np.int64)
    starts = np.array([header.payload_offset + r.offset for _, r in refs], np.int64)
    lengths = np.array([r.length for _, r in refs], np.int64)
    return refs, k, starts, lengths


@pytest.fixture(params=[False, True], ids=["calling thread", "threads"])
def threads(request, monkeypatch):
    """Tables read on the calling thread, or by threads of a few chunks each."""
    if request.param:
        monkeypatch.setattr(stream_tables, "CHUNKS_A_THREAD", 3)


@pytest.mark.parametrize(
    "dtype,shape,chunk,p", [(torch.float32, (300, 41), 512, 0.05), (torch.bfloat16, (300, 1000), 1 << 16, 0.2)]
)
def test_stream_tables_match_the_format_reader(dtype, shape, chunk, p, threads):
    old, new = make_pair(11, dtype, shape, "weights", "density", "ulp", p)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=chunk)
    refs, k, starts, lengths = _sparse_refs(pack)
    assert refs
    st = stream_tables.read(np.frombuffer(pack, np.uint8), starts, lengths, k, 16)
    for i, (t, ref) in enumerate(refs):
        start = ref.offset + read_header(pack).payload_offset
        for c, g in enumerate(read_groups(pack[start : start + ref.length])):
            row = i * 16 + c
            assert st.events[row] == (g.count if g.streams else 0)
            for j, s in enumerate(g.streams):
                assert (st.codec[row, j], st.raw[row, j]) == (s.codec, s.raw_len)
                assert pack[st.at[row, j] : st.at[row, j] + st.stored[row, j]] == bytes(s.data)


def test_truncated_table_is_refused(threads):
    old, new = make_pair(12, torch.float32, (300, 41), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=512)
    refs, k, starts, lengths = _sparse_refs(pack)
    with pytest.raises(PackFormatError):
        stream_tables.read(np.frombuffer(pack, np.uint8), starts, np.minimum(lengths, 3), k, 16)


def _table_rows(pack: bytes, start: int, length: int, k: int):
    """(events, [(codec, raw, stored, offset)] per class) of one chunk by the format's reader,
    or None where it refuses the chunk or the chunk breaks the sparse layout."""
    try:
        groups = read_groups(memoryview(pack)[start : start + length])
    except PackFormatError:
        return None
    if len(groups) != k or any(len(g.streams) not in (0, 4) for g in groups):
        return None
    base = np.frombuffer(pack, np.uint8).ctypes.data
    return [
        (
            g.count if g.streams else 0,
            [
                (
                    s.codec,
                    s.raw_len,
                    len(s.data),
                    np.frombuffer(s.data, np.uint8).ctypes.data - base if len(s.data) else None,
                )
                for s in g.streams
            ],
        )
        for g in groups
    ]


def test_corrupt_tables_are_refused_or_read_as_the_format_reader_reads_them(threads):
    """A byte of a chunk's table replaced at random: the reader refuses the chunks exactly
    where the format's reader (or the sparse layout) does, and reads the rest the same."""
    old, new = make_pair(13, torch.float32, (300, 41), "weights", "density", "ulp", 0.3)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=512)
    refs, k, starts, lengths = _sparse_refs(pack)
    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(300):
        bad = bytearray(pack)
        i = int(rng.integers(0, len(refs)))
        bad[starts[i] + int(rng.integers(0, min(24, lengths[i])))] = int(rng.integers(0, 256))
        bad = bytes(bad)
        expect = [_table_rows(bad, s, n, c) for s, n, c in zip(starts, lengths, k)]
        if any(e is None for e in expect):
            with pytest.raises(PackFormatError):
                stream_tables.read(np.frombuffer(bad, np.uint8), starts, lengths, k, 16)
            refused += 1
            continue
        st = stream_tables.read(np.frombuffer(bad, np.uint8), starts, lengths, k, 16)
        for j, groups in enumerate(expect):
            for c, (events, streams) in enumerate(groups):
                row = j * 16 + c
                assert st.events[row] == events
                for s, (codec, raw, stored, at) in enumerate(streams):
                    assert (st.codec[row, s], st.raw[row, s], st.stored[row, s]) == (codec, raw, stored)
                    assert at is None or st.at[row, s] == at
    assert 0 < refused < 300


def _plan_reference(codec, raw, stored, at, lo):
    """The device buffer's layout as vectorised numpy (what the GPU stage computed before
    its compiled walk)."""
    from weight_teleport.codec import streams as codecs
    from weight_teleport.codec.cuda.stage.decode_streams import A

    slots = lambda n: (np.cumsum(-(-n // A) * A) - -(-n // A) * A, int((-(-n // A) * A).sum()))
    out_off, out_total = slots(raw)
    zs = np.isin(codec, [codecs.ZSTD, codecs.LZ4, codecs.NVCOMP_ANS])
    comp_off, comp_total = slots(stored[zs])
    dst = out_off.copy()
    dst[zs] = comp_off + out_total
    keep = stored > 0
    copies = np.stack([at[keep] - lo, dst[keep], stored[keep]], 1)
    return out_off, out_total, comp_total, copies, np.flatnonzero(zs), comp_off + out_total


def test_inflate_layout_matches_the_vectorised_layout():
    """The stage's buffer layout (slots, copies, coded streams: zstd and the GPU-only lz4 and
    nvcomp-ans) from one compiled walk, against the numpy computation it replaced, on real
    stream tables and random ones. A stream the walk refuses (an unknown codec, a raw stream
    of another length than its table's, a coded stream empty either way) raises the CPU
    decoder's error for it (for lz4 and nvcomp-ans, which the CPU does not decode, its own)."""
    from weight_teleport.codec import streams as codecs
    from weight_teleport.codec.cuda.stage import decode_streams

    old, new = make_pair(14, torch.float32, (300, 41), "weights", "density", "ulp", 0.3)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=512)
    _, k, starts, lengths = _sparse_refs(pack)
    st = stream_tables.read(np.frombuffer(pack, np.uint8), starts, lengths, k, 16)
    rng = np.random.default_rng(5)
    cases = [(st.codec.ravel(), st.raw.ravel(), st.stored.ravel(), st.at.ravel())]
    for n in (0, 1, 7, 1000):
        codec = rng.integers(0, 4, n)
        stored = rng.integers(0, 300, n) * (rng.random(n) < 0.7)
        raw = np.where(codec != codecs.RAW, rng.integers(1, 5000, n), stored)
        stored = np.where(codec != codecs.RAW, np.maximum(stored, 1), stored)
        cases.append((codec, raw, stored, np.cumsum(stored) - stored + 7))
    for codec, raw, stored, at in cases:
        lo = int(at.min()) if at.size else 0
        got = decode_streams._layout(pack, codec, raw, stored, at, lo)
        want = _plan_reference(codec, raw, stored, at, lo)
        assert (got.out_total, got.comp_total) == want[1:3]
        for g, w in zip((got.out_off, got.copies, got.coded, got.comp_off), want[:1] + want[3:]):
            np.testing.assert_array_equal(g, w)
    codec, raw, stored, at = cases[-1]
    blob = bytes(int(at[-1] + stored[-1]))
    for bad, message in (
        ("unknown codec", "stream codec"),
        ("raw length", "raw stream holds"),
        ("empty zstd", "empty zstd stream"),
        ("zstd of no bytes", "zstd stream is corrupted"),
        ("empty lz4", "lz4 stream is empty"),
        ("nvcomp-ans of no bytes", "nvcomp-ans stream is empty"),
    ):
        c, r, s = codec.copy(), raw.copy(), stored.copy()
        which = {"raw length": codecs.RAW, "empty lz4": codecs.LZ4, "nvcomp-ans of no bytes": codecs.NVCOMP_ANS}
        i = int(np.flatnonzero(c == which.get(bad, codecs.ZSTD))[3])
        if bad == "unknown codec":
            c[i] = 9
        elif bad == "raw length":
            r[i] = s[i] + 1
        elif bad in ("empty zstd", "empty lz4"):
            r[i] = 0
        else:
            s[i] = 0
        n = c.size
        outs = (np.empty(n, np.int64), np.empty((n, 3), np.int64), np.empty(n, np.int64), np.empty(n, np.int64))
        assert decode_streams._plan(c, r, s, at, 0, *outs)[0] == i
        with pytest.raises(PackFormatError, match=message):
            decode_streams._layout(blob, c, r, s, at, 0)


def test_size_buckets_are_powers_of_four():
    """nvCOMP's groups of streams (nvcomp._buckets, a compiled counting sort): by codec
    (zstd, lz4, nvcomp-ans), then by ceil(log4(length)) (0 for lengths 0 and 1), in a stable
    order, against numpy's; a codec nvCOMP does not decode is refused."""
    from weight_teleport.codec import streams as codecs
    from weight_teleport.codec.cuda.runtime import nvcomp

    rng = np.random.default_rng(8)
    for n in (0, 1, 9, 5000):
        lengths = np.concatenate(
            [
                rng.integers(0, 1 << int(rng.integers(1, 41)), n),
                [0, 1, 2, 3, 4, 5, 15, 16, 17, 1 << 40, (1 << 40) + 1, 1 << 47],
            ]
        ).astype(np.int64)
        for codec in (None, rng.choice([codecs.ZSTD, codecs.LZ4, codecs.NVCOMP_ANS], lengths.size)):
            group = np.zeros(lengths.size, np.int64) if codec is None else codec - codecs.ZSTD
            key = group * nvcomp.MAX_BUCKETS + np.ceil(np.log2(np.maximum(lengths, 1)) / 2).astype(np.int64)
            order = np.argsort(key, kind="stable")
            bounds = np.concatenate([[0], np.flatnonzero(np.diff(key[order])) + 1, [lengths.size]]).tolist()
            names = [("zstd", "lz4", "ans")[k // nvcomp.MAX_BUCKETS] for k in key[order][bounds[:-1]]]
            got = nvcomp._buckets(lengths, codec)
            np.testing.assert_array_equal(got[0], order)
            assert got[1] == list(zip(bounds[:-1], bounds[1:], names))
    with pytest.raises(ValueError, match="nvCOMP"):
        nvcomp._buckets(np.ones(3, np.int64), np.array([codecs.ZSTD, codecs.RAW, codecs.LZ4]))


def test_helper_walk_matches_the_tables_and_layout():
    """The stage's one compiled walk on a helper thread (sparse.StreamsRead: tables,
    layout and the zstd streams' size buckets, into arena memory another call left dirty)
    against stream_tables.read, decode_streams.prepare and nvcomp._buckets; a truncated chunk table is
    refused once the walk is waited for."""
    from concurrent.futures import ThreadPoolExecutor

    from weight_teleport.codec.cuda.runtime import memory, nvcomp
    from weight_teleport.codec.cuda.stage import decode_streams, sparse
    from weight_teleport.format.container import ChunkSpans

    old, new = make_pair(15, torch.float32, (300, 41), "weights", "density", "ulp", 0.3)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=512)
    header = read_header(pack)
    recs = [t for t in header.tensors if t.codec == "sparse"]
    n_classes = np.array([max(c for _, c in t.classes) + 1 for t in recs], np.int64)
    spans = ChunkSpans.of(header, recs)
    _, k, starts, lengths = _sparse_refs(pack)
    st = stream_tables.read(np.frombuffer(pack, np.uint8), starts, lengths, k, 16)
    want = [a.copy() for a in st.arrays()], decode_streams.prepare(pack, st, "cpu")
    want_layout = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in want[1].layout]
    with ThreadPoolExecutor(1) as pool:
        memory.begin_call()
        memory.arena().empty(1 << 22, np.uint8).fill(0xA5)
        memory.begin_call()
        read = sparse.StreamsRead(pack, spans, recs, n_classes, *spans.bounds(), pool)
        got = read.result("cpu")
        for g, w in zip(got.table.arrays(), want[0]):
            np.testing.assert_array_equal(g, w)
        for g, w in zip(got.prep.layout, want_layout):
            if isinstance(w, np.ndarray) and w.ndim == 2:  # the copies: pack offsets from each one's `lo`
                g, w = g + [got.prep.lo, 0, 0], w + [want[1].lo, 0, 0]
            np.testing.assert_array_equal(g, w)
        assert got.prep.lo == spans.bounds()[0] and got.prep.hi == spans.bounds()[1]
        lay, zs = got.prep.layout, got.prep.layout.coded
        order, ranges = nvcomp._buckets(raw := st.raw.ravel()[zs], st.codec.ravel()[zs])
        assert zs.size and len(ranges) > 1
        rows = np.stack([lay.comp_off, st.stored.ravel()[zs], raw, lay.out_off[zs]])[:, order]
        np.testing.assert_array_equal(read.bucketed[0], order)
        assert read.bucketed[1] == ranges
        np.testing.assert_array_equal(read.bucketed[2], rows)
        short = ChunkSpans(spans.starts, np.minimum(spans.lengths, 3), spans.crcs, spans.payload_offset)
        read = sparse.StreamsRead(pack, short, recs, n_classes, *short.bounds(), pool)
        with pytest.raises(PackFormatError, match="chunk table"):
            read.result("cpu")


def _varint_reference(data: bytes, p: int, end: int) -> tuple[int, int]:
    """LEB128 as docs/FORMAT.md defines it, with the reader's limits: at most VARINT_MAX
    bytes, inside [p, end), a value of at most MAX_VALUE; (-1, end) or (-1, next) otherwise."""
    value = 0
    for k in range(stream_tables.VARINT_MAX):
        if p + k >= end:
            return -1, end
        value |= (data[p + k] & 0x7F) << (7 * k)
        if data[p + k] < 0x80:
            return (value if value <= stream_tables.MAX_VALUE else -1), p + k + 1
    return -1, end


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 0x7F), st.integers(0x80, 0xFF), st.sampled_from([0x80, 0xFF, 0x01])),
        min_size=1,
        max_size=14,
    ),
    st.integers(0, 13),
    st.integers(0, 14),
)
@example([0x80] * 9 + [0x01], 0, 10).via("2^63: past 64 bits as a signed value")
@example([0x80] * 9 + [0x02], 0, 10).via("2^64: wraps to 0 in 64 bits")
@example([0xFF] * 8 + [0x7F], 0, 9).via("2^63 - 1")
@example([0x80] * 6 + [0x40], 0, 7).via("2^48: MAX_VALUE")
@example([0x81] + [0x80] * 5 + [0x40], 0, 7).via("MAX_VALUE + 1")
def test_varints_read_as_the_format_defines_them(data, p, end):
    """Every byte string, start and end: the compiled reader's value and next position are
    the reference's, also for varints too long, past their end or above MAX_VALUE."""
    data = bytes(data)
    p, end = min(p, len(data)), min(end, len(data))
    assert read_varint(np.frombuffer(data, np.uint8), p, end) == _varint_reference(data, p, end)


@pytest.mark.parametrize(
    "value", [0, 1, 127, 128, 300, 1 << 35, stream_tables.MAX_VALUE, stream_tables.MAX_VALUE + 1, (1 << 63) - 1]
)
def test_varint_limits(value):
    """Written by the format's encoder: read back, or refused (-1) above MAX_VALUE."""
    out = bytearray()
    _put_varint(out, value)
    n = len(out)
    want = value if value <= stream_tables.MAX_VALUE else -1
    assert read_varint(np.frombuffer(bytes(out), np.uint8), 0, n) == (want, n)
