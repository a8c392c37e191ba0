"""The CUDA backend's host helpers, which need no GPU: the per-thread arena of a call's
temporary tables, the upload of host tables, the fused scatter's program rows, the cache
of chunk tables and their records' cuts, the encoder's two waves (their cut, and their events merged), and the
stage's digest checks over all records at once."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_teleport.codec.cuda.encode import encoder, sparse
from weight_teleport.codec.cuda.kernels import chunk_table, encode_symbols, stage_scatter
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda.stage import staging
from weight_teleport.codec.cuda.stage.staging import _program_rows
from weight_teleport.codec.dtypes import dtype_info
from weight_teleport.errors import DigestMismatchError, PackMismatchError


def test_arena_arrays_are_aligned_apart_and_reused_after_a_rewind():
    arena = memory.HostArena()
    a = arena.zeros(1000, np.int64)
    b = arena.empty((300, 3), np.int32)
    b.fill(7)
    assert not a.any() and not np.shares_memory(a, b)
    assert a.ctypes.data % 8 == 0 and b.ctypes.data % 8 == 0 and b.shape == (300, 3)
    buffer = arena.buffer
    arena.rewind()
    c = arena.empty(1000, np.int64)
    assert np.shares_memory(a, c) and arena.buffer is buffer


def test_arena_grows_to_a_whole_call_and_keeps_what_it_gave():
    """Full, the arena takes a buffer as large as the call has taken so far; arrays already
    taken keep their bytes, and the next call fits in the new buffer."""
    arena = memory.HostArena()
    a = arena.empty(100_000, np.int64)  # 800 KB of the first 1 MB buffer
    a[:] = np.arange(a.size)
    b = arena.zeros(50_000, np.int64)  # does not fit: a new buffer
    assert (a == np.arange(a.size)).all() and not b.any() and not np.shares_memory(a, b)
    grown = arena.buffer
    assert grown.size >= a.nbytes + b.nbytes
    arena.rewind()
    arena.empty(100_000, np.int64), arena.empty(50_000, np.int64)
    assert arena.buffer is grown


def test_arena_holds_a_call_that_filled_several_buffers_from_the_next_call_on():
    """A call whose tables outgrow the arena's buffer more than once: at the rewind the
    buffer becomes as large as the whole call took, so the next call that takes as much
    replaces nothing (nor the one after)."""
    arena = memory.HostArena()
    sizes = [300_000 + 37 * k for k in range(12)]  # int64 tables of 2.4 MB, 29 MB a call
    replaced = []
    for _ in range(3):
        before, n = arena.buffer, 0
        arena.rewind()
        for size in sizes:
            arena.empty(size, np.int64)
            n += arena.buffer is not before
            before = arena.buffer
        replaced.append(n)
    assert replaced[0] >= 2 and replaced[1:] == [1, 0]  # the second call's at its rewind
    assert arena.buffer.size == sum(-(-s * 8 // 64) * 64 for s in sizes)


def test_zeros_from_the_arena_are_zero_after_reuse():
    arena = memory.HostArena()
    arena.empty(4096, np.uint8).fill(255)
    arena.rewind()
    assert not arena.zeros(4096, np.uint8).any()


def test_tables_uploaded_from_the_arena_are_copies():
    """`to_device` puts its arrays end to end in the thread's arena; what it returns (here on
    the CPU, where an upload is a copy) keeps its values after the arena is reused."""
    arrays = [
        np.array([True, False, True]),
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.array([-(1 << 40), 5], np.int64),
        np.zeros(0, np.int64),
    ]
    memory.begin_call()
    got = memory.to_device(arrays, "cpu")
    memory.begin_call()
    memory.arena().empty(4096, np.int64).fill(-1)
    for a, g in zip(arrays, got):
        assert tuple(g.shape) == a.shape and str(g.dtype) == "torch.int64"
        np.testing.assert_array_equal(g.numpy(), a.astype(np.int64))


def _rows_reference(elem, first, n, block):
    """The fused scatter's program rows as vectorised numpy (what the stage computed before
    its compiled walk)."""
    k, j = memory.items(-(-n // block))
    lo = first[k] + j * block
    hi = np.minimum(lo + block, first[k] + n[k])
    return np.stack([elem[k], lo, hi], axis=1).astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 5000), max_size=40), st.sampled_from([1, 7, stage_scatter.BLOCK]), st.integers(0, 1 << 40)
)
def test_program_rows_match_the_vectorised_rows(counts, block, base):
    n = np.array(counts, np.int64)
    first = np.cumsum(n) - n
    elem = base + np.arange(n.size, dtype=np.int64) * (1 << 22)
    out = np.full((int((-(-n // block)).sum()), 3), -1, np.int64)
    _program_rows(elem, first, n, block, out)
    np.testing.assert_array_equal(out, _rows_reference(elem, first, n, block))


def test_chunk_tables_are_reused_for_the_same_pointers_and_sizes():
    info = dtype_info(torch.bfloat16)
    ws = [torch.zeros(n, dtype=torch.bfloat16) for n in (1000, 70, 3000)]
    first = chunk_table.build_cached(ws, 256, 128, info)
    again = chunk_table.build_cached(ws, 256, 128, info)
    assert again.rows is first.rows and again.base.data_ptr() == min(w.data_ptr() for w in ws)
    fresh = chunk_table.build(ws, 256, 128, info)
    assert np.array_equal(again.host, fresh.host) and torch.equal(again.program_chunk, fresh.program_chunk)
    grown = ws[:2] + [torch.zeros(3001, dtype=torch.bfloat16)]
    other = chunk_table.build_cached(grown, 256, 128, info)
    assert other.rows is not first.rows and np.array_equal(other.host, chunk_table.build(grown, 256, 128, info).host)
    assert chunk_table.build_cached(ws, 512, 128, info).rows is not first.rows  # another chunk size


def test_chunk_tables_follow_records_cuts():
    """Records over boxes cut where a sampler's slice ends (`cuts`) get those chunks, beside
    tensors of regular chunks; a table of other cuts is another table."""
    info = dtype_info(torch.bfloat16)
    ws = [torch.zeros(n, dtype=torch.bfloat16) for n in (1000, 70, 600)]
    cuts = [None, [24, 46], [256, 8, 256, 80]]
    tensor, start, length = chunk_table.chunk_rows(np.array([1000, 70, 600]), 256, cuts)
    assert tensor.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert length.tolist() == [256, 256, 256, 232, 24, 46, 256, 8, 256, 80]
    assert start.tolist() == [0, 256, 512, 768, 0, 24, 0, 256, 264, 520]
    table = chunk_table.build_cached(ws, 256, 128, info, cuts)
    assert table.host[:, chunk_table.LEN].tolist() == length.tolist()
    assert chunk_table.build_cached(ws, 256, 128, info).chunks == 8  # regular chunks: another table
    assert chunk_table.build_cached(ws, 256, 128, info, cuts).rows is table.rows


def test_waves_cut_a_large_state_in_two_halves_of_its_elements():
    waves = lambda sizes: encoder._waves(np.array(sizes, np.int64))
    m = 1 << 20
    # 50 of 105 M elements, then 55
    assert waves([40 * m, 0, 10 * m, 30 * m, 0, 20 * m, 5 * m]) == [[0, 2], [3, 5, 6]]
    assert waves([1000, 0, 70]) == [[0, 2]]  # below WAVE_ELEMS: one wave
    assert waves([0, 80 * m]) == [[1]]  # one item with elements
    assert waves([80 * m, 1]) == [[0], [1]]  # never an empty wave
    assert waves([0]) == [[]]


def test_merged_events_pad_each_waves_chunks_to_the_most_class_slots():
    """Two waves' events as one batch's: the segment tables end to end, the first wave's
    chunks (4 class slots) padded with empty segments to the second's 8; the chunk indices
    continue across the waves; the ranks and residuals stay a piece per wave."""

    def events(chunks, ncp, seed):
        g = torch.Generator().manual_seed(seed)
        ev = torch.randint(0, 50, (chunks * ncp,), generator=g)
        seg = encode_symbols.Segments(ev, ev // 2, ev % 3 == 0, 16)
        ranks = [torch.arange(int(ev.sum()), dtype=torch.int32)]
        return sparse.Events(
            ranks,
            [torch.zeros(int((ev // 2).sum()), dtype=torch.int16)],
            seg,
            ncp,
            np.full(chunks, ncp - 1),
            np.array([0, 2, chunks]),
        )

    a, b = events(3, 4, 0), events(5, 8, 1)
    m = sparse.merge([a, b])
    assert m.ncp == 8 and m.segments.pieces == (24, 40) and m.segments.bits == 16
    assert m.ranks == a.ranks + b.ranks and m.residuals == a.residuals + b.residuals
    for which in ("ev_cnt", "res_cnt", "inverted"):
        got = getattr(m.segments, which).view(8, 8)
        assert torch.equal(got[:3, :4], getattr(a.segments, which).view(3, 4)) and not got[:3, 4:].any()
        assert torch.equal(got[3:], getattr(b.segments, which).view(5, 8))
    assert m.first_chunk.tolist() == [0, 2, 3, 5, 8] and m.n_groups.tolist() == [3] * 3 + [7] * 5
    assert sparse.merge([a]) is a


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_stage_digest_checks_over_all_records_refuse_what_the_scalar_checks_refuse(data):
    """`stage._digest_failures` (uint64 arithmetic over every record) names exactly the
    records whose digests `_check_base` and `_check_result` refuse: word sums of either sign,
    sizes, and digests off by one bit or in another form (upper case, short, missing)."""
    k = data.draw(st.integers(0, 12))
    u64, i64 = st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1)
    nbytes = np.array(data.draw(st.lists(st.integers(1, 2**40), min_size=k, max_size=k)), np.uint64)
    sums = np.array(data.draw(st.lists(st.tuples(i64, i64), min_size=k, max_size=k)), np.int64).reshape(k, 2)
    recs = []
    for i in range(k):
        s_old, s_new, n = int(sums[i, 0]), int(sums[i, 1]), int(nbytes[i])
        base = D.finish(s_old, n)  # the base digest the old weights have
        new = D.finish(D.word_sum(base, n) + s_new - s_old, n)  # and the patched weights
        base = data.draw(st.sampled_from([base, base ^ (1 << data.draw(st.integers(0, 63)))]))
        new = data.draw(st.sampled_from([new, new ^ 1, data.draw(u64)]))
        texts = [D.to_hex(base), D.to_hex(new)]
        form = data.draw(st.sampled_from(["hex", "hex", "hex", "upper", "short"]))
        if form == "upper":
            texts[0] = texts[0].upper()
        elif form == "short":
            texts[1] = texts[1][1:]
        recs.append(SimpleNamespace(name=f"t{i}", base_digest=texts[0], digest=texts[1]))
    header = SimpleNamespace(base_version=0)
    bad_base, bad_result = staging._digest_failures(recs, nbytes, sums)
    for i, rec in enumerate(recs):
        n, s_old, s_new = int(nbytes[i]), int(sums[i, 0]), int(sums[i, 1])
        try:
            staging._check_base(rec, n, s_old, header)
        except PackMismatchError:
            assert i in bad_base
        try:
            staging._check_result(rec, n, s_old, s_new)
        except (DigestMismatchError, ValueError):  # ValueError: a digest that is not hex
            assert i in bad_result
    canonical = all(len(t) == 16 and t == t.lower() for r in recs for t in (r.base_digest, r.digest))
    if canonical:  # then it names only those
        for i, rec in enumerate(recs):
            n, s_old, s_new = int(nbytes[i]), int(sums[i, 0]), int(sums[i, 1])
            if i in bad_base:
                with pytest.raises(PackMismatchError):
                    staging._check_base(rec, n, s_old, header)
            if i in bad_result:
                with pytest.raises(DigestMismatchError):
                    staging._check_result(rec, n, s_old, s_new)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-2, 12), st.integers(-2, 12), st.integers(-2, 12)), max_size=8),
    st.integers(0, 12),
    st.integers(0, 12),
)
def test_gather_rows_inside_both_buffers_as_numpy_says(rows, n_src, n_dst):
    """The gather's check of its rows (one compiled pass) against numpy's reading of it: each
    row copies a non-empty range inside both buffers."""
    from weight_teleport.codec.cuda.kernels.gather import _inside

    r = np.array(rows, np.int64).reshape(-1, 3)
    ends = r[:, :2] + r[:, 2:]
    want = bool(
        (r[:, 2] > 0).all() and (r[:, :2] >= 0).all() and (ends[:, 0] <= n_src).all() and (ends[:, 1] <= n_dst).all()
    )
    assert _inside(r, n_src, n_dst) == want
