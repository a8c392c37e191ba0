"""The slice API a sampler rank uses (codec/slices.py): the header alone says where a
record's chunks lie; chunks [i, j) are fetched as one byte range and staged against the
rank's own old elements (`stage_delta` with `held`), each chunk checked alone; hostile
bytes raise typed errors, and nothing is written."""

from collections import namedtuple

import pytest
import torch

import weight_teleport as wt
from weight_teleport.codec.slices import chunk_byte_range, chunk_window, record_layout
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
    sl = wt.TensorSlice(old.shape, box)
    o, n = old[8:24].contiguous(), new[8:24].contiguous()
    if snapshot:
        return wt.encode_snapshot({"w": n}, version=2, chunk_elems=64, slices={"w": sl}, hints={"w": hint})
    return wt.encode_delta({"w": o}, {"w": n}, base_version=1, version=2, chunk_elems=64, slices={"w": sl},
                           hints={"w": hint})


def _held(cols):
    return {"w": wt.TensorSlice((ROWS, COLS), ((0, ROWS), (cols[0], cols[1] - cols[0])))}


def _fetched(pack, held) -> tuple:
    """The header, and a buffer laid out as the pack holding its first bytes and the rank's
    chunks alone (what a sampler rank fetches): the rest is garbage."""
    h = read_header(pack[:1 << 16], total_length=len(pack))
    _, i, j = chunk_window(h, h.tensors[0], held["w"].box)
    lo, hi = chunk_byte_range(h, h.tensors[0], i, j)
    buf = bytearray(b"\xa5" * len(pack))
    buf[:h.payload_offset] = pack[:h.payload_offset]
    buf[lo:hi] = pack[lo:hi]
    return h, buf, (lo, hi)


def _sampler_stage(pack, old, cols=(COLS // 2, COLS)):
    """Sampler rank 1 (columns 12..23): stage its chunks against its own columns, write them."""
    held = _held(cols)
    mine = {"w": old[:, cols[0]:cols[1]].clone()}
    h, buf, _ = _fetched(pack, held)
    wt.apply_staged(mine, wt.stage_delta(mine, bytes(buf), header=h, held=held))
    return mine["w"], chunk_window(h, h.tensors[0], held["w"].box)[0]


@pytest.mark.parametrize("hint", [wt.Hint("cols", (COLS // 2 * ROWS,)), ("cols", [COLS // 2 * ROWS]),
                                  SliceHint("cols", (COLS // 2 * ROWS,))])
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
    want[8:24, COLS // 2:] = new[8:24, COLS // 2:]
    assert torch.equal(got.view(torch.int16), want[:, COLS // 2:].view(torch.int16))


def test_an_uncut_pack_is_refused_for_a_slice_inside_a_chunk():
    old, new = _pair()
    pack = _trainer_part(old, new, wt.Hint("cols"))
    with pytest.raises(PackMismatchError, match="not cut"):
        _sampler_stage(pack, old, cols=(5, COLS))


def _ready(pack, old):
    held = _held((COLS // 2, COLS))
    h, buf, span = _fetched(pack, held)
    return h, buf, span, {"w": old[:, COLS // 2:].clone()}, held


def test_hostile_chunk_bytes_and_wrong_base_raise_typed_errors():
    old, new = _pair()
    h, data, (lo, hi), mine, held = _ready(_trainer_part(old, new, wt.Hint("cols", (COLS // 2 * ROWS,))), old)
    before = mine["w"].clone()
    flipped = bytearray(data)
    flipped[(lo + hi) // 2] ^= 0x10
    with pytest.raises(PackFormatError, match="CRC"):
        wt.stage_delta(mine, bytes(flipped), header=h, held=held)
    with pytest.raises(PackFormatError):
        wt.stage_delta(mine, bytes(data[:hi - 3]), held=held)
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
    h, data, _, mine, held = _ready(_trainer_part(old, new, wt.Hint("cols", (COLS // 2 * ROWS,))), old)
    rec = h.tensors[0]
    k = chunk_window(h, rec, held["w"].box)[1]
    rec.chunk_digests[k], rec.chunk_digests[k - 1] = rec.chunk_digests[k - 1], rec.chunk_digests[k]
    with pytest.raises(DigestMismatchError, match=f"chunk {k}"):
        wt.stage_delta(mine, bytes(data), header=h, held=held)
