"""The slice API a sampler rank uses (codec/slices.py): the header alone says where a
record's chunks lie; chunks [i, j) are fetched as one byte range and staged against the
rank's own old elements (`stage_delta` with `held`), each chunk checked alone; hostile
bytes raise typed errors, and nothing is written."""

from collections import namedtuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import weight_teleport as wt
from weight_teleport.codec import Hint, TensorSlice
from weight_teleport.codec.slices import chunk_byte_ranges, chunk_window, record_layout
from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.format import read_header

ROWS, COLS = 32, 24
SliceHint = namedtuple("SliceHint", "order bounds")  # the shape of targets.vllm_layout.SliceHint


def _pair(seed=4):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn((ROWS, COLS), generator=g).to(torch.bfloat16)
    new = old.clone()
    idx = torch.randperm(old.numel(), generator=g)[: old.numel() // 10]
    new.view(-1)[idx] = (new.view(-1)[idx].float() * 1.01).to(torch.bfloat16)
    return old, new


def _trainer_part(old, new, hint, snapshot=False):
    """The pack of the trainer rank holding rows 8..23, cut for a sampler split at column 12."""
    box = ((8, 16), (0, COLS))
    sl = TensorSlice(old.shape, box)
    o, n = old[8:24].contiguous(), new[8:24].contiguous()
    if snapshot:
        return wt.encode_snapshot({"w": n}, version=2, chunk_elems=64, slices={"w": sl}, hints={"w": hint})
    return wt.encode_delta(
        {"w": o}, {"w": n}, base_version=1, version=2, chunk_elems=64, slices={"w": sl}, hints={"w": hint}
    )


def _held(cols):
    return {"w": TensorSlice((ROWS, COLS), ((0, ROWS), (cols[0], cols[1] - cols[0])))}


def _fetched(pack, held) -> tuple:
    """The header, and a buffer laid out as the pack holding its first bytes and the rank's
    chunks alone (what a sampler rank fetches): the rest is garbage."""
    h = read_header(pack[: 1 << 16], total_length=len(pack))
    _, i, j = chunk_window(h, h.tensors[0], held["w"].box)
    ((lo, hi),) = chunk_byte_ranges(h, h.tensors[0], i, j)
    buf = bytearray(b"\xa5" * len(pack))
    buf[: h.payload_offset] = pack[: h.payload_offset]
    buf[lo:hi] = pack[lo:hi]
    return h, buf, (lo, hi)


def _sampler_stage(pack, old, cols=(COLS // 2, COLS)):
    """Sampler rank 1 (columns 12..23): stage its chunks against its own columns, write them."""
    held = _held(cols)
    mine = {"w": old[:, cols[0] : cols[1]].clone()}
    h, buf, _ = _fetched(pack, held)
    wt.apply_staged(mine, wt.stage_delta(mine, bytes(buf), header=h, held=held))
    return mine["w"], chunk_window(h, h.tensors[0], held["w"].box)[0]


@pytest.mark.parametrize(
    "hint", [Hint("cols", (COLS // 2 * ROWS,)), ("cols", [COLS // 2 * ROWS]), SliceHint("cols", (COLS // 2 * ROWS,))]
)
@pytest.mark.parametrize("snapshot", [False, True])
def test_a_sampler_rank_stages_its_columns_of_a_trainer_ranks_rows(hint, snapshot):
    old, new = _pair()
    pack = _trainer_part(old, new, hint, snapshot)
    layout = record_layout(read_header(pack), read_header(pack).tensors[0])
    assert layout.order == "cols" and layout.box == ((8, 16), (0, COLS)) and layout.shape == (ROWS, COLS)
    assert (COLS // 2 * 16) in [s for s, _ in layout.spans]
    got, walk_start = _sampler_stage(pack, old)
    assert walk_start == COLS // 2 * 16
    want = old.clone()
    want[8:24, COLS // 2 :] = new[8:24, COLS // 2 :]
    assert torch.equal(got.view(torch.int16), want[:, COLS // 2 :].view(torch.int16))


def test_an_uncut_pack_is_refused_for_a_slice_inside_a_chunk():
    old, new = _pair()
    pack = _trainer_part(old, new, Hint("cols"))
    with pytest.raises(PackMismatchError, match="not cut"):
        _sampler_stage(pack, old, cols=(5, COLS))


def _ready(pack, old):
    held = _held((COLS // 2, COLS))
    h, buf, span = _fetched(pack, held)
    return h, buf, span, {"w": old[:, COLS // 2 :].clone()}, held


def test_hostile_chunk_bytes_and_wrong_base_raise_typed_errors():
    old, new = _pair()
    h, data, (lo, hi), mine, held = _ready(_trainer_part(old, new, Hint("cols", (COLS // 2 * ROWS,))), old)
    before = mine["w"].clone()
    flipped = bytearray(data)
    flipped[(lo + hi) // 2] ^= 0x10
    with pytest.raises(PackFormatError, match="CRC"):
        wt.stage_delta(mine, bytes(flipped), header=h, held=held)
    with pytest.raises(PackFormatError):
        wt.stage_delta(mine, bytes(data[: hi - 3]), held=held)
    stale = {"w": mine["w"].clone()}
    stale["w"].view(torch.int16)[10, 2] ^= 1  # a row of the trainer rank's part
    with pytest.raises(PackMismatchError, match="base version"):
        wt.stage_delta(stale, bytes(data), header=h, held=held)
    with pytest.raises(PackMismatchError, match="in the state"):
        wt.stage_delta({"w": mine["w"][:, 1:]}, bytes(data), header=h, held=held)
    with pytest.raises(PackMismatchError, match="in the state"):
        wt.stage_delta({"w": mine["w"].float()}, bytes(data), header=h, held=held)
    assert torch.equal(mine["w"].view(torch.int16), before.view(torch.int16))


def test_a_chunk_digest_that_does_not_match_its_chunk_is_caught():
    """A writer's wrong digest for one chunk (recomputed so the record sum still adds up)."""
    old, new = _pair()
    h, data, _, mine, held = _ready(_trainer_part(old, new, Hint("cols", (COLS // 2 * ROWS,))), old)
    rec = h.tensors[0]
    k = chunk_window(h, rec, held["w"].box)[1]
    rec.chunk_digests[k], rec.chunk_digests[k - 1] = rec.chunk_digests[k - 1], rec.chunk_digests[k]
    with pytest.raises(DigestMismatchError, match=f"chunk {k}"):
        wt.stage_delta(mine, bytes(data), header=h, held=held)


def _layered(seed=7):
    """Old and new states of a few tensors the way a TP=2 publisher hints them: rows split
    at half, columns split at half, one tensor every rank holds whole; 10% changed."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (64, 40), "o": (40, 64), "norm": (40,), "up": (96, 40), "down": (40, 96)}
    old = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    new = {}
    for k, t in old.items():
        moved = torch.rand(t.shape, generator=g) < 0.1
        new[k] = torch.where(moved, (t.float() * 1.01).to(torch.bfloat16), t)
    hints = {
        "q": SliceHint("rows", (32 * 40,)),
        "up": SliceHint("rows", (48 * 40,)),
        "o": SliceHint("cols", (32 * 40,)),
        "down": SliceHint("cols", (48 * 40,)),
        "norm": SliceHint("rows", ()),
    }
    return old, new, hints


def _rank_box(shape, order, rank):
    if len(shape) == 1:
        return ((0, shape[0]),)
    if order == "rows":
        half = shape[0] // 2
        return ((rank * half, half), (0, shape[1]))
    half = shape[1] // 2
    return ((0, shape[0]), (rank * half, half))


def _runs(ranges) -> list:
    """Byte ranges merged where they touch."""
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def test_a_tp_rank_reads_its_slices_of_every_tensor_in_two_runs_of_bytes():
    """A delta cut at TP=2 bounds lays the shared records' chunks first, then slice 0 of
    every record, then slice 1 (codec/layout.py): each rank's chunks are two runs of bytes
    however many tensors there are, the whole pack still round-trips bit for bit, and a
    rank stages its slices from its runs alone."""
    old, new, hints = _layered()
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=256, hints=hints)
    h = read_header(pack)
    for rank in (0, 1):
        ranges = []
        held = {}
        for rec in h.tensors:
            box = _rank_box(tuple(rec.shape), hints[rec.name].order, rank)
            held[rec.name] = TensorSlice(tuple(rec.shape), box)
            _, i, j = chunk_window(h, rec, box)
            ranges += chunk_byte_ranges(h, rec, i, j)
        assert len(_runs(ranges)) <= 2, _runs(ranges)
        buf = bytearray(b"\xa5" * len(pack))  # the rank's runs alone, the rest garbage
        buf[: h.payload_offset] = pack[: h.payload_offset]
        for a, b in _runs(ranges):
            buf[a:b] = pack[a:b]
        mine = {k: old[k][tuple(slice(o, o + e) for o, e in held[k].box)].clone() for k in old}
        wt.apply_staged(mine, wt.stage_delta(mine, bytes(buf), header=h, held=held))
        for k in old:
            want = new[k][tuple(slice(o, o + e) for o, e in held[k].box)]
            assert torch.equal(mine[k].view(torch.int16), want.contiguous().view(torch.int16)), (rank, k)
    whole = {k: v.clone() for k, v in old.items()}
    wt.apply_delta(whole, pack)
    assert all(torch.equal(whole[k].view(torch.int16), new[k].view(torch.int16)) for k in new)


def test_a_pack_without_slice_bounds_keeps_its_records_chunks_in_record_order():
    old, new, hints = _layered()
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=256)
    offsets = [c[0] for rec in read_header(pack).tensors for c in rec.chunks]
    assert offsets == sorted(offsets)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.sampled_from([8, 16, 24]),
    cols=st.sampled_from([8, 16, 24]),
    order=st.sampled_from(["rows", "cols"]),
    cut_lines=st.sets(st.integers(1, 23), max_size=3),
    density=st.floats(0.0, 1.0),
    chunk_elems=st.sampled_from([8, 16, 64]),
    seed=st.integers(0, 2**16),
)
def test_a_pack_laid_out_by_slice_round_trips_and_tiles_its_payload(
    rows, cols, order, cut_lines, density, chunk_elems, seed
):
    """Any slice bounds: the payload's chunks tile it exactly (no byte shared, none left
    over), and the pack turns the old weights into the new ones bit for bit, beside a
    tensor every receiver reads whole."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"w": (rows, cols), "v": (cols, 8), "n": (cols,)}
    old = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    new = {
        k: torch.where(torch.rand(t.shape, generator=g) < density, (t.float() * 1.5).to(torch.bfloat16), t)
        for k, t in old.items()
    }
    line = cols if order == "rows" else rows
    lines = rows if order == "rows" else cols
    bounds = tuple(sorted(b * line for b in cut_lines if b < lines))
    hints = {"w": SliceHint(order, bounds), "v": SliceHint("rows", (8 * (cols // 2),)), "n": SliceHint("rows", ())}
    pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=chunk_elems, hints=hints)
    h = read_header(pack)
    spans = sorted((o, n) for rec in h.tensors for o, n, _ in rec.chunks)
    assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert sum(n for _, n in spans) == h.payload_length
    state = {k: v.clone() for k, v in old.items()}
    wt.apply_delta(state, pack)
    assert all(torch.equal(state[k].view(torch.int16), new[k].view(torch.int16)) for k in new)
