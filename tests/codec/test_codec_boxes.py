"""Records over boxes (format version 2): trainer ranks' shards encoded alone, assembled by
a receiver of whole tensors (CPU or, marked `cuda`, GPU weights), and slices of records staged by receivers holding slices, bit
for bit, with each chunk checked on its own."""

import pytest
import torch
from helpers import assert_bits_equal

import weight_teleport as wt
from weight_teleport.codec import Hint, TensorSlice
from weight_teleport.errors import DigestMismatchError, PackMismatchError
from weight_teleport.format import read_header

ROWS, COLS = 32, 24


def _pair(seed=0, shape=(ROWS, COLS)):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(shape, generator=g).to(torch.bfloat16)
    new = old.clone()
    flat = new.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[: flat.numel() // 10]
    flat[idx] = (flat[idx].float() * 1.01).to(torch.bfloat16)
    return old, new


def _shards(t, n, dim):
    """Uneven contiguous shards of `t` along `dim` (as torch.tensor_split) and their boxes."""
    out, at = [], 0
    for part in torch.tensor_split(t, n, dim):
        box = [(0, d) for d in t.shape]
        box[dim] = (at, part.shape[dim])
        at += part.shape[dim]
        out.append((part.contiguous(), TensorSlice(t.shape, box)))
    return out


@pytest.mark.parametrize("dim, n, order", [(0, 3, "rows"), (1, 3, "rows"), (0, 4, "cols"), (1, 2, "cols")])
def test_shards_encoded_alone_assemble_the_whole_tensor(dim, n, order):
    old, new = _pair()
    live = {"w": old.clone()}
    for (o, sl), (nw, _) in zip(_shards(old, n, dim), _shards(new, n, dim)):
        pack = wt.encode_delta(
            {"w": o}, {"w": nw}, base_version=1, version=2, chunk_elems=16, slices={"w": sl}, hints={"w": Hint(order)}
        )
        h = read_header(pack)
        assert h.format_version == 2 and tuple(map(tuple, h.tensors[0].box)) == sl.box
        wt.apply_delta(live, pack)
    assert_bits_equal(live, {"w": new})


CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda)"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dim, order, bound", [(0, "rows", COLS * 13), (1, "cols", ROWS * 5)])
def test_parts_cut_at_a_samplers_bound_assemble_on_any_device(device, dim, order, bound):
    """Snapshot then delta parts whose records are cut where a sampler's slice ends, staged
    against whole tensors on the CPU or on the GPU (a row box is a contiguous view there, a
    column walk a copy written back)."""
    old, new = _pair()
    live, cut = {"w": torch.zeros_like(old).to(device)}, False
    opts = dict(version=2, chunk_elems=64, hints={"w": Hint(order, (bound,))})
    for (o, sl), (nw, _) in zip(_shards(old, 3, dim), _shards(new, 3, dim)):
        wt.apply_delta(live, wt.encode_snapshot({"w": o}, slices={"w": sl}, **{**opts, "version": 1}))
    assert_bits_equal({"w": live["w"].cpu()}, {"w": old})
    for (o, sl), (nw, _) in zip(_shards(old, 3, dim), _shards(new, 3, dim)):
        pack = wt.encode_delta({"w": o}, {"w": nw}, base_version=1, slices={"w": sl}, **opts)
        cut |= bool(read_header(pack).tensors[0].cuts)
        wt.apply_delta(live, pack)
    assert cut and live["w"].device.type == device
    assert_bits_equal({"w": live["w"].cpu()}, {"w": new})


def test_snapshot_parts_assemble_and_whole_packs_stay_version_1():
    _, new = _pair()
    assert read_header(wt.encode_snapshot({"w": new}, version=1)).format_version == 1
    live = {"w": torch.zeros_like(new)}
    for part, sl in _shards(new, 3, 0):
        wt.apply_delta(live, wt.encode_snapshot({"w": part}, version=1, slices={"w": sl}))
    assert_bits_equal(live, {"w": new})


@pytest.mark.parametrize("order, dim", [("rows", 0), ("cols", 1)])
def test_slice_holders_stage_only_their_chunks(order, dim):
    """A trainer rank's record cut at two sampler ranks' bounds: each sampler rank stages the
    chunks inside its slice against its own elements alone."""
    old, new = _pair(1)
    trainer = _shards(old, 2, 0)[1][1]  # the trainer rank holding rows 16..31
    o_part, n_part = old[16:], new[16:]
    bounds = ((COLS // 2) * ROWS,) if order == "cols" else ((ROWS * 3 // 4) * COLS,)
    pack = wt.encode_delta(
        {"w": o_part.contiguous()},
        {"w": n_part.contiguous()},
        base_version=1,
        version=2,
        chunk_elems=64,
        slices={"w": trainer},
        hints={"w": Hint(order, bounds)},
    )
    for mine in _shards(old, 2, dim):
        local, sl = mine[0].clone(), mine[1]
        wt.apply_delta({"w": local}, pack, held={"w": sl})
        want = old.clone()
        want[16:] = new[16:]
        view = want[tuple(slice(o, o + e) for o, e in sl.box)]
        assert_bits_equal({"w": local}, {"w": view})


def test_a_slice_across_chunks_is_refused_and_a_bad_chunk_named():
    old, new = _pair(2)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=1, version=2, chunk_elems=64, hints={"w": Hint("rows")})
    part = old[: ROWS // 3].clone()
    with pytest.raises(PackMismatchError, match="not cut at the bounds"):
        wt.stage_delta({"w": part}, pack, held={"w": TensorSlice(old.shape, [(0, ROWS // 3), (0, COLS)])})
    local = old[: ROWS // 2].clone()
    local.view(torch.int16)[0] ^= 1
    pack = wt.encode_delta(
        {"w": old},
        {"w": new},
        base_version=1,
        version=2,
        chunk_elems=64,
        hints={"w": Hint("rows", ((ROWS // 2) * COLS,))},
    )
    held = {"w": TensorSlice(old.shape, [(0, ROWS // 2), (0, COLS)])}
    with pytest.raises(PackMismatchError, match="chunk 0"):
        wt.stage_delta({"w": local}, pack, held=held)
    local.view(torch.int16)[0] ^= 1
    with pytest.raises(DigestMismatchError):
        _corrupt_stage(local, pack, held)


def _corrupt_stage(local, pack, held):
    """A chunk digest that lies (the header re-framed with its CRC) is caught on its own."""
    from hostile import chunks_of, framed, header_json, with_chunks

    h = header_json(pack)
    rec = h["tensors"][0]
    digests = rec["chunk_digests"]
    bumped = f"{(int(digests[0], 16) + 1) % (1 << 64):016x}"
    other = f"{(int(digests[1], 16) - 1) % (1 << 64):016x}"
    rec["chunk_digests"] = [bumped, other, *digests[2:]]
    forged = framed(*with_chunks(h, chunks_of(pack)))
    wt.stage_delta({"w": local}, forged, held=held, check_base=False)


def test_odd_shapes_and_dtypes_round_trip_through_shards():
    g = torch.Generator().manual_seed(3)
    for dtype, shape in [(torch.float32, (7, 3, 5)), (torch.int8, (9, 11)), (torch.float16, (13,))]:
        old = (torch.randn(shape, generator=g) * 50).to(dtype)
        new = old.clone()
        new.view(-1)[::3] += 1
        live = {"w": old.clone()}
        for (o, sl), (nw, _) in zip(_shards(old, 3, 0), _shards(new, 3, 0)):
            wt.apply_delta(
                live,
                wt.encode_delta(
                    {"w": o},
                    {"w": nw},
                    base_version=1,
                    version=2,
                    chunk_elems=8,
                    slices={"w": sl},
                    hints={"w": Hint("cols")},
                ),
            )
        assert_bits_equal(live, {"w": new})
