"""The slice API a sampler rank uses (codec/slices.py): the header alone says where a
record's chunks lie; chunks [i, j) are fetched as one byte range and staged against the
rank's own old elements, each chunk checked alone; hostile bytes raise typed errors."""

from collections import namedtuple

import pytest
import torch

import weight_teleport as wt
from weight_teleport.codec.slices import chunk_byte_range, chunk_positions, chunk_window, record_layout, stage_chunks
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


def _sampler_stage(pack, old, cols=(COLS // 2, COLS)):
    """Sampler rank 1 (columns 12..23): stage its chunks, scatter into its column walk."""
    h = read_header(pack[:1 << 16])
    rec = h.tensors[0]
    walk_start, i, j = chunk_window(h, rec, ((0, ROWS), (cols[0], cols[1] - cols[0])))
    lo, hi = chunk_byte_range(h, rec, i, j)
    mine = old[:, cols[0]:cols[1]].T.contiguous().reshape(-1)  # the rank's slice of the column walk
    first = cols[0] * ROWS
    local = mine[chunk_positions(h, rec, i, j) - first]
    pos, val = stage_chunks(h, rec, (i, j), local, pack[lo:hi])
    mine[pos - first] = val
    return mine, walk_start


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
    assert torch.equal(got.view(torch.int16), want[:, COLS // 2:].T.contiguous().reshape(-1).view(torch.int16))


def test_an_uncut_pack_is_refused_for_a_slice_inside_a_chunk():
    old, new = _pair()
    pack = _trainer_part(old, new, wt.Hint("cols"))
    with pytest.raises(PackMismatchError, match="not cut"):
        _sampler_stage(pack, old, cols=(5, COLS))


def _ready(pack, old):
    h = read_header(pack)
    rec = h.tensors[0]
    _, i, j = chunk_window(h, rec, ((0, ROWS), (COLS // 2, COLS // 2)))
    lo, hi = chunk_byte_range(h, rec, i, j)
    local = old.T.contiguous().reshape(-1)[chunk_positions(h, rec, i, j)]
    return h, rec, (i, j), local, bytearray(pack[lo:hi])


def test_hostile_chunk_bytes_and_wrong_base_raise_typed_errors():
    old, new = _pair()
    h, rec, rng, local, data = _ready(_trainer_part(old, new, wt.Hint("cols", (COLS // 2 * ROWS,))), old)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    with pytest.raises(PackFormatError, match="CRC"):
        stage_chunks(h, rec, rng, local, bytes(flipped))
    with pytest.raises(PackFormatError):
        stage_chunks(h, rec, rng, local, bytes(data[:-3]))
    stale = local.clone()
    stale.view(torch.int16)[3] ^= 1
    with pytest.raises(PackMismatchError, match="base version"):
        stage_chunks(h, rec, rng, stale, bytes(data))
    with pytest.raises(PackMismatchError, match="local_walk"):
        stage_chunks(h, rec, rng, local[:-8], bytes(data))
    with pytest.raises(PackMismatchError, match="local_walk"):
        stage_chunks(h, rec, rng, local.float(), bytes(data))
    with pytest.raises(ValueError):
        stage_chunks(h, rec, (rng[0], len(rec.chunks) + 1), local, bytes(data))


def test_a_chunk_digest_that_does_not_match_its_chunk_is_caught():
    """A writer's wrong digest for one chunk (recomputed so the record sum still adds up)."""
    old, new = _pair()
    h, rec, rng, local, data = _ready(_trainer_part(old, new, wt.Hint("cols", (COLS // 2 * ROWS,))), old)
    k = rng[0]
    rec.chunk_digests[k], rec.chunk_digests[k - 1] = rec.chunk_digests[k - 1], rec.chunk_digests[k]
    with pytest.raises(DigestMismatchError, match=f"chunk {k}"):
        stage_chunks(h, rec, rng, local, bytes(data))
