"""The contract every codec backend passes (tests/codec/backends.py: cpu, triton-interpreter,
cuda): packs written on a backend are the CPU backend's bytes, packs staged and applied on it
give the new weights bit for bit, its digests are the CPU's, corrupt chunks behind renewed
CRCs are refused with the state untouched, versions made of parts and a worker's slices
stage exactly, and each codec's pack of a small delta is its golden bytes. The kernel-level
checks (walk copy, CRC-32, chunk tables, per-tensor sums, decoder edges) run on the backends
that run the CUDA backend's kernels.

The interpreter runs a kernel's programs one by one in Python, and its time goes with the
chunks a call handles (each at least a program of every kernel, the CRC's a byte a step):
its states are of one to a few chunks, and its round trips a selection of the grid the
other backends run. Nothing here bounds its time (a busy machine is slow, not wrong)."""

import dataclasses
import hashlib
import importlib
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from backends import CPU, CUDA, INTERPRETER, backend, corrupt, gpu_backend, pair, params, same_bits  # noqa: F401
from helpers import (
    DTYPES,
    bits,
    chunk_table_failures,
    clone_state,
    crc_ranges,
    decode_one_gap,
    decoded_one_gap,
    inverted_pair,
    popcount_prefix,
    with_renewed_crcs,
)
from test_codec_roundtrip import make_pair
from test_format_golden import GOLDEN_DELTA, GOLDEN_DENSE_RESIDUAL, GOLDEN_SNAPSHOT, _states

import weight_teleport as wt
from weight_teleport.codec import Hint, TensorSlice, inspect, tensor_digest
from weight_teleport.codec import digest as D
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.errors import DigestMismatchError, PackMismatchError, WeightTeleportError
from weight_teleport.format import read_groups, read_header
from weight_teleport.format.codecs import CHOICES, CODECS


def portable(b) -> dict:
    """encode_delta's keyword arguments that make backend `b` write the CPU backend's bytes."""
    if not b.gpu_path:
        return {}
    from weight_teleport.codec.cuda.config import CudaCodecConfig

    return {"cuda": CudaCodecConfig(stream_coder="cpu-zstd")}


def _many_classes_pair(seed):
    """Elements of 17 exponents: 4 of those of exponent b < 16 change, among about
    4 * 2^((b + 1/2) / 2) (the middle of the class plan's half-octave band b), none of the
    last exponent's: with 4 events needed a class (the `free_classes` fixture), the plan
    reaches its limit of 16 classes in one chunk (3,144 elements)."""
    g = torch.Generator().manual_seed(seed)
    counts = [int(4 * 2 ** ((b + 0.5) / 2)) + 1 for b in range(16)] + [200]
    e = torch.cat([torch.full((c,), b) for b, c in enumerate(counts)])
    moved = torch.cat([torch.arange(c) < (4 if b < 16 else 0) for b, c in enumerate(counts)])
    order = torch.randperm(e.numel(), generator=g)
    e, moved = e[order], moved[order]
    old = (torch.ldexp(1 + torch.rand(e.numel(), generator=g), -e - 3)).bfloat16()
    return old, torch.where(moved, (old.float() * 1.01).bfloat16(), old)


@pytest.fixture
def free_classes(monkeypatch):
    """The sparse codec with classes free: many classes from small tensors."""
    monkeypatch.setitem(CODECS, "sparse", dataclasses.replace(CODECS["sparse"], class_cost_bits=0.0))


# --- packs and stages of states ---------------------------------------------------------------

CASES = {
    "bf16": (torch.bfloat16, (9000,), 0.02),
    "bf16-dense": (torch.bfloat16, (3000, 1100), 0.8),
    "f32-batches": (torch.float32, (3000,), 0.05),
    "f16-widths": (torch.float16, (3000,), 0.1),
    "f64": (torch.float64, (2000,), 0.05),
    "f8-widths": (torch.float8_e4m3fn, (3000,), 0.05),
    "i32-widths": (torch.int32, (3000,), 0.05),
    "inverted": (torch.bfloat16, (3000,), None),
    "16-classes": (torch.bfloat16, (), "classes"),
}
"""name: (dtype, element counts of its tensors, density or None: an inverted class, "classes":
16 classes). The tensors are of one chunk (4,096 elements), but for one of three chunks
(first, middle and last); the float32 state has several tensors of a type in one batch, its
types interleaved; "-widths": types of one width with other bit layouts beside it."""
PINNED = {"bf16"}
"""The state (one batch) whose pack is written around its payload in place (pinned=True)."""
TWO_WAVES = {"f32-batches", "inverted", "16-classes"}
"""The states scanned in two waves, their events merged, written into pinned memory (several
batches: copied there)."""


def _state(name):
    i = list(CASES).index(name)
    dtype, sizes, density = CASES[name]
    old, new = {}, {}
    for j, n in enumerate(sizes):
        o, m = inverted_pair(n, j) if density is None else pair(dtype, n, density, 10 * i + j)
        old[f"t{j}"], new[f"t{j}"] = o, m
    if density == "classes":
        old["t0"], new["t0"] = _many_classes_pair(0)
    if dtype == torch.float32:  # a second element type (two batches), and a view off 8-byte alignment
        old["h"], new["h"] = pair(torch.bfloat16, 2000, 0.03, 99)
        old["v"], new["v"] = (x[1:] for x in pair(torch.bfloat16, 2001, 0.03, 98))
        old["w"], new["w"] = pair(torch.float32, 1500, 0.05, 97)  # the first type again: batches interleave
        old["d"], new["d"] = pair(torch.float32, 1000, 0.8, 95)  # dense (CPU-coded) beside sparse batches
        old["z"], new["z"] = pair(torch.bfloat16, 1000, 0.0, 94)  # unchanged
    # element types of one width with other bit layouts: each is a batch of its own
    for other in {
        torch.float16: [torch.bfloat16, torch.int16],
        torch.int32: [torch.float32],
        torch.float8_e4m3fn: [torch.float8_e5m2, torch.int8],
    }.get(dtype, []):
        old[str(other)], new[str(other)] = pair(other, 1500, 0.08, 96)
    return old, new


@pytest.mark.parametrize("case", list(CASES))
def test_packs_of_states_are_the_cpus_and_stage_exactly(backend, case, free_classes, monkeypatch):
    """A state's pack written on the backend is the CPU backend's bytes (one batch's pack
    written around its payload in pinned memory; states scanned in two waves, their events
    merged); the CPU's pack staged and applied on the backend gives the new weights bit for
    bit. The 16-classes state reaches the class plan's limit."""
    from weight_teleport.codec.cuda.encode import encoder

    old, new = _state(case)
    cpu_pack = wt.encode_delta(old, new, base_version=0, version=1, chunk_elems=4096)
    kw = portable(backend)
    if backend.gpu_path and case in PINNED | TWO_WAVES:
        kw["pinned"] = True
        if case in TWO_WAVES:
            monkeypatch.setattr(encoder, "WAVE_ELEMS", 0)
    with backend.active():
        pack = wt.encode_delta(
            backend.inputs(old), backend.inputs(new), base_version=0, version=1, chunk_elems=4096, **kw
        )
    assert bytes(pack) == cpu_pack
    if case == "16-classes":
        assert max(c for t in read_header(cpu_pack).tensors for _, c in t.classes) == 15
    state = backend.to(old)
    with backend.active():
        wt.apply_staged(state, wt.stage_delta(state, cpu_pack))
    assert same_bits(state, new)


MODES = [("none", 0.0), ("single", 0.0), ("density", 0.01), ("density", 0.5), ("all", 0.0)]
GRID = [(dt, m, p, c) for dt in DTYPES for m, p in MODES for c in ("ulp", "specials")]
"""Round trips the cpu and cuda backends run: every dtype, density and kind of change."""
INTERPRETED_GRID = [
    (torch.bfloat16, "density", 0.5, "specials"),
    (torch.float8_e5m2, "density", 0.5, "specials"),
    (torch.float32, "all", 0.0, "ulp"),
    (torch.bool, "all", 0.0, "ulp"),
]
"""The interpreter's selection of them: dense adversarial changes of 2- and 1-byte types, every
element of a 4-byte type and of bool changed (the states above cover the other widths)."""


def _grid_id(case):
    dt, m, p, c = case
    return f"{str(dt).removeprefix('torch.')}-{m}{p or ''}-{c}"


@pytest.mark.parametrize(
    "backend,case",
    [
        *[
            pytest.param(b, case, id=f"{b}-{_grid_id(case)}", marks=[pytest.mark.cuda] if b == CUDA else [])
            for b in (CPU, CUDA)
            for case in GRID
        ],
        *[pytest.param(INTERPRETER, case, id=f"{INTERPRETER}-{_grid_id(case)}") for case in INTERPRETED_GRID],
    ],
    indirect=["backend"],
)
def test_round_trip_of_random_and_adversarial_changes(backend, case):
    """Two tensors (one the other's rows reversed) of a dtype, changed by ulps or to
    adversarial bit patterns (NaN payloads, infinities, signed zeros, subnormals), none to
    all of them: the backend's pack is the CPU's bytes, and staged on the backend it gives the
    new weights bit for bit, the digest verified. On CUDA the GPU's default stream coders
    write the same streams, which the CPU decodes."""
    dtype, mode, p, change = case
    o, n = make_pair(7, dtype, (37, 29), "weights", mode, change, p)
    old, new = {"w": o, "b": o.flip(0).contiguous()}, {"w": n, "b": n.flip(0).contiguous()}
    cpu_pack = wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=256)
    with backend.active():
        pack = wt.encode_delta(
            backend.inputs(old), backend.inputs(new), base_version=1, version=2, chunk_elems=256, **portable(backend)
        )
    assert pack == cpu_pack
    state = backend.to(old)
    with backend.active():
        report = wt.apply_delta(state, pack, base_version=1)
    assert same_bits(state, new) and report.digest_verified
    if backend.name == CUDA:  # the GPU's own coders (Huffman, nvCOMP): other bytes, the same streams
        gpu_pack = wt.encode_delta(backend.inputs(old), backend.inputs(new), base_version=1, version=2, chunk_elems=256)
        assert _raw_streams(gpu_pack) == _raw_streams(cpu_pack)
        on_cpu = clone_state(old)
        wt.apply_delta(on_cpu, gpu_pack, base_version=1)
        assert same_bits(on_cpu, new)


def _raw_streams(pack: bytes) -> list[bytes]:
    """Every stream of every chunk, decoded (what the entropy coder was given)."""
    from weight_teleport.codec.cpu import chunks as C

    header = read_header(pack)
    out = []
    for rec in header.tensors:
        for ref in rec.chunks:
            start = header.payload_offset + ref.offset
            for g in read_groups(pack[start : start + ref.length]):
                out += [C._decoded(s).tobytes() for s in g.streams]
    return out


# --- corrupt chunks -------------------------------------------------------------------------


def _staged_corruptions(b, pack: bytes, old, new, edits: list) -> int:
    """How many of `pack`'s corruptions `edits` ((chunk, byte, value) behind a renewed CRC; a
    pack of tensor "w") staging on backend `b` refuses: a refused one leaves the state
    untouched, an accepted one (a byte the decoder does not read) gives the new weights."""
    refused = 0
    for edit in edits:
        bad = corrupt(pack, *edit)
        state = {"w": b.tensor(old)}
        try:
            with b.active():
                wt.apply_staged(state, wt.stage_delta(state, bad))
        except WeightTeleportError:
            refused += 1
            assert same_bits(state, {"w": old}), f"{edit} refused but the state changed"
            continue
        assert same_bits(state, {"w": new}), f"{edit} accepted and the result is not the new weights"
    return refused


def test_corrupt_chunks_behind_renewed_crcs_are_refused(backend):
    """Chunks of a 2-chunk `sparse` pack corrupted behind renewed CRCs: at least half refused,
    each with the state untouched; the others (bytes the decoder does not read) exact."""
    if backend.name == CUDA:
        # edit (0, 11, 1) breaks a zstd frame of chunk 0: nvCOMP's batched zstd decoder fails
        # with status 1000 and leaves an illegal memory access, which loses the process's CUDA
        # context (edits 1-5 are refused with typed errors); not run until that is fixed
        pytest.xfail("a corrupt zstd frame faults nvCOMP's batched zstd decoder (docs/ARCHITECTURE.md)")
    old, new = pair(torch.bfloat16, 5000, 0.05, 7)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=4096)
    edits = [(k % 2, 37 * k + 11, (59 * k + 1) % 256) for k in range(6)]
    assert _staged_corruptions(backend, pack, old, new, edits) >= 3


# --- sparse_ac (adaptive) ---------------------------------------------------------------------

ADAPTIVE_STATES = [
    (torch.bfloat16, 800, 0.02, 256),
    (torch.float32, 120, 0.9, 64),
    (torch.float16, 200, 0.3, 4096),
    (torch.int8, 300, 0.5, 128),
    (torch.float64, 200, 0.05, 64),
    (torch.bfloat16, 3000, 0.002, 1 << 22),
]
"""(dtype, elements, density, chunk_elems) of the `sparse_ac` states: every element width,
inverted classes (density 0.9), several chunks and one."""


@pytest.mark.parametrize(
    "i", range(len(ADAPTIVE_STATES)), ids=[f"{str(d).removeprefix('torch.')}-{p}" for d, _, p, _ in ADAPTIVE_STATES]
)
def test_sparse_ac_packs_are_the_cpus_and_stage_exactly(backend, i, monkeypatch):
    """`sparse_ac` packs written on the backend are the CPU's bytes (the first state with
    its chunks' first room too small for their streams: coded again), staged bit-exact, a
    record and its reversal (two tensors of one batch)."""
    from weight_teleport.codec.cuda.encode import adaptive

    dtype, n, density, chunk = ADAPTIVE_STATES[i]
    old, new = pair(dtype, n, density, 1)
    olds, news = {"a": old, "b": old.flip(0)}, {"a": new, "b": new.flip(0)}
    pack = wt.encode_delta(olds, news, base_version=0, version=1, chunk_elems=chunk, codec="sparse_ac")
    assert {t.codec for t in read_header(pack).tensors} == {"sparse_ac"}
    if i == 0:
        for name, value in (("ROOM_BASE", 1), ("ROOM_EVENT", 0), ("ROOM_CHANGE", 0)):
            monkeypatch.setattr(adaptive, name, value)
    with backend.active():
        got = wt.encode_delta(
            backend.inputs(olds), backend.inputs(news), base_version=0, version=1, chunk_elems=chunk, codec="sparse_ac"
        )
    assert bytes(got) == pack
    state = backend.to(olds)
    with backend.active():
        wt.apply_staged(state, wt.stage_delta(state, pack))
    assert same_bits(state, news)


def test_auto_picks_a_codec_per_record_as_the_cpu_does(backend):
    """`auto` packs written on the backend are the CPU's bytes: records at or under
    AUTO_AC_MAX_DENSITY coded with sparse_ac, others with sparse, of two element types (four
    batches on the GPU), staged bit-exact. The GPU writes the sparse records' streams with
    the CPU's zstd here: its own Huffman frames are other bytes of the same streams."""
    olds, news = {}, {}
    for name, (dtype, n, density) in {
        "bf16_sparse": (torch.bfloat16, 3000, 0.004),
        "bf16_dense": (torch.bfloat16, 600, 0.2),
        "f32_sparse": (torch.float32, 2000, 0.005),
        "f32_dense": (torch.float32, 300, 0.1),
    }.items():
        olds[name], news[name] = pair(dtype, n, density, len(olds))
    pack = wt.encode_delta(olds, news, base_version=0, version=1, chunk_elems=1024, codec="auto")
    codecs = {t.name: t.codec for t in read_header(pack).tensors}
    assert codecs == {
        "bf16_sparse": "sparse_ac",
        "bf16_dense": "sparse",
        "f32_sparse": "sparse_ac",
        "f32_dense": "sparse",
    }
    with backend.active():
        got = wt.encode_delta(
            backend.inputs(olds),
            backend.inputs(news),
            base_version=0,
            version=1,
            chunk_elems=1024,
            codec="auto",
            **({"cuda": CudaCodecConfig(stream_coder="cpu-zstd")} if backend.gpu_path else {}),
        )
    assert bytes(got) == pack
    state = backend.to(olds)
    with backend.active():
        wt.apply_staged(state, wt.stage_delta(state, pack))
    assert same_bits(state, news)


def test_corrupt_sparse_ac_chunks_are_refused(backend):
    """`sparse_ac` chunks corrupted behind renewed CRCs: at least half refused with the state
    untouched, the others exact."""
    old, new = pair(torch.bfloat16, 800, 0.02, 3)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=200, codec="sparse_ac")
    edits = [(k % 4, 7 * k + 3, (59 * k + 1) % 256) for k in range(6)]
    assert _staged_corruptions(backend, pack, old, new, edits) >= 3


# --- snapshots -------------------------------------------------------------------------------


def _snapshot_state():
    g = torch.Generator().manual_seed(0)
    state = {
        "bf16": (torch.randn(2100, generator=g) * 0.02).bfloat16(),  # three chunks, the last short
        "f32": torch.randn(7, 13, generator=g),
        "i8": torch.randint(-5, 5, (300,), generator=g).to(torch.int8),
        "empty": torch.zeros(0, dtype=torch.float16),
        "f64": torch.randn(1100, generator=g).double(),
        "nan": torch.tensor([float("nan"), -0.0, 0.0, float("-inf")]).bfloat16(),
    }
    for i, dt in enumerate(DTYPES):  # every dtype, random bit patterns
        state[f"t{i}"] = make_pair(40 + i, dt, (31, 7), "random", "none", "ulp", 0.0)[0]
    return state


def test_snapshots_are_the_cpus_and_stage_exactly(backend, monkeypatch):
    """Snapshots written on the backend, of `dense_values` records (the CUDA backend's raw
    planes, which the CPU's zstd planes may outsize: other bytes of the same values), are the
    same bytes whatever its waves (one to a few chunks, cut inside tensors both ways) and in
    pinned memory on a GPU; the CPU decodes them and the backend stages them bit for bit; a
    corrupt plane behind a renewed CRC is refused by the digest, nothing written."""
    from weight_teleport.codec.cuda import snapshot

    state = _snapshot_state()
    cpu_pack = wt.encode_snapshot(state, version=3, chunk_elems=1024)
    assert {t["codec"] for t in inspect(cpu_pack)["tensors"]} == {"dense_values"}
    waves = [1 << 30, 5000] if backend.gpu_path else [None]
    first = None
    for wave in waves:
        if wave is not None:
            monkeypatch.setattr(snapshot, "WAVE_BYTES", wave)
        with backend.active():
            pack = wt.encode_snapshot(backend.inputs(state), version=3, chunk_elems=1024, pinned=backend.name == CUDA)
        first = bytes(pack) if first is None else first
        assert {t["codec"] for t in inspect(pack)["tensors"]} == {"dense_values"}
        assert bytes(pack) == (first if backend.gpu_path else cpu_pack), f"waves of {wave} bytes"
        assert same_bits(wt.decode_snapshot(bytes(pack)), state)
        live = backend.to({k: torch.zeros_like(v) for k, v in state.items()})
        with backend.active():
            wt.apply_staged(live, wt.stage_delta(live, pack))
        assert same_bits(live, state)

    def flip(i: int, chunk: bytearray) -> None:
        if i == 1:  # the second chunk of the first tensor: a byte of its planes
            chunk[50] ^= 0x40

    bad = with_renewed_crcs(cpu_pack, flip)
    live = backend.to({k: torch.zeros_like(v) for k, v in state.items()})
    with pytest.raises(DigestMismatchError), backend.active():
        wt.stage_delta(live, bad)
    assert all(not v.view(torch.uint8).any() for v in live.values()), "a refused pack wrote weights"


# --- records over walks, with cuts, staged in part -------------------------------------------


@pytest.mark.parametrize("kind", ["delta", "snapshot"])
@pytest.mark.parametrize("cut", ["cuts", "regular"])
def test_records_over_walks_are_the_cpus(backend, kind, cut):
    """Records over walks (cut at a receiver's slice bounds, by rows and by columns, or
    regular chunks; a digest per chunk; sparse and dense) written on the backend are the
    CPU's bytes."""
    old, new = pair(torch.bfloat16, 64 * 64, 0.05, 7)
    dense = pair(torch.float32, 48 * 40, 0.5, 8)
    olds, news = (
        {"w": old.view(64, 64), "d": dense[0].view(48, 40)},
        {"w": new.view(64, 64), "d": dense[1].view(48, 40)},
    )
    hints = (
        {"w": Hint("rows", (32 * 64,)), "d": Hint("cols", (10 * 48, 30 * 48))}
        if cut == "cuts"
        else {"w": Hint("cols", ()), "d": Hint("rows", ())}
    )

    def encode(o, n, **kw):
        return (
            wt.encode_delta(o, n, base_version=0, version=1, chunk_elems=512, hints=hints, **kw)
            if kind == "delta"
            else wt.encode_snapshot(n, version=1, chunk_elems=512, hints=hints)
        )

    want = encode(olds, news)
    assert all(t.chunk_digests for t in read_header(want).tensors)
    with backend.active():
        got = encode(backend.inputs(olds), backend.inputs(news), **(portable(backend) if kind == "delta" else {}))
    assert bytes(got) == want


def test_records_with_cuts_stage_whole_and_in_part(gpu_backend):
    """Records with cuts staged on the GPU path, whole and in part (a slice's run of chunks,
    checked against its chunk digests), are bit-exact; a record without chunk digests staged
    in part is refused, the state untouched."""
    b = gpu_backend
    old, new = (t.view(64, 64) for t in pair(torch.bfloat16, 64 * 64, 0.05, 7))
    cut = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, hints={"w": Hint("rows", (32 * 64,))})
    whole = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=1024)
    live = {"w": b.tensor(old)}
    with b.active():
        wt.apply_delta(live, cut)
    assert same_bits(live, {"w": new})
    bottom = TensorSlice((64, 64), ((32, 32), (0, 64)))
    live = {"w": b.tensor(old[32:])}
    with b.active():
        wt.apply_delta(live, cut, held={"w": bottom})
    assert same_bits(live, {"w": new[32:]})
    live = {"w": b.tensor(old[32:])}
    with pytest.raises(PackMismatchError, match="no chunk digests"), b.active():
        wt.stage_delta(live, whole, held={"w": bottom})
    assert same_bits(live, {"w": old[32:]})


# --- versions made of parts, a worker's slices ------------------------------------------------

PART_SHAPES = {"rows": (40, 24), "cols": (24, 40), "tile": (30, 20), "norm": (50,)}
"""Tensors of a version made of two trainer ranks' parts: row shards cut by a sampler's
bound, column shards walked by columns, a rectangular tile each rank (rows and columns
split), a tensor on one rank alone."""


def _part_boxes(rank: int) -> dict:
    """Rank `rank`'s box of each tensor it holds (uneven)."""
    boxes = {
        "rows": ((0, 16), (0, 24)) if rank == 0 else ((16, 24), (0, 24)),
        "cols": ((0, 24), (0, 16)) if rank == 0 else ((0, 24), (16, 24)),
        "tile": ((0, 12), (0, 8)) if rank == 0 else ((12, 18), (8, 12)),
    }
    if rank == 0:
        boxes["norm"] = ((0, 50),)
    return boxes


@pytest.mark.parametrize("kind", ["delta", "snapshot"])
def test_parts_stage_against_whole_tensors(gpu_backend, kind):
    """Versions made of parts staged on the GPU path against whole tensors (what a CUDA
    TorchTarget's subscriber does: each record against the walk view of its box, chunks cut
    where the records' cuts say), then applied: bit-exact, each record's digest checked
    after; a part corrupted behind renewed CRCs is refused with nothing written, or (a byte
    no decoder reads) gives the right weights. The tile's other corners stay at the base."""
    from weight_teleport.pipeline import assemble, verify
    from weight_teleport.pipeline.fetch import Fetched

    b = gpu_backend

    def stage(state, packs):  # as the subscriber stages what fetch_parts returns
        checked = [Fetched(p, read_header(p)) for p in packs]
        with b.active():
            return assemble.stage_parts(state, checked, base_version=0 if kind == "delta" else None)

    hints = {"rows": Hint("rows", (20 * 24,)), "cols": Hint("cols", (24 * 4, 24 * 30))}  # off the 64s
    g = torch.Generator().manual_seed(5)
    old = {k: (torch.randn(s, generator=g) * 0.02).bfloat16() for k, s in PART_SHAPES.items()}
    new = {}
    for k, t in old.items():
        u = t.view(torch.int16).clone()
        u[torch.rand(t.shape, generator=g) < 0.1] += 1
        new[k] = u.view(torch.bfloat16)
    parts = []
    for rank in (0, 1):
        boxes = _part_boxes(rank)
        cut = lambda st: {k: st[k][tuple(slice(o, o + e) for o, e in bx)].contiguous() for k, bx in boxes.items()}  # noqa: E731
        opts = dict(
            version=1,
            chunk_elems=64,
            threads=1,
            hints=hints,
            slices={k: TensorSlice(PART_SHAPES[k], bx) for k, bx in boxes.items()},
        )
        parts.append(
            wt.encode_delta(cut(old), cut(new), base_version=0, **opts)
            if kind == "delta"
            else wt.encode_snapshot(cut(new), **opts)
        )
    assert any(t.cuts for p in parts for t in read_header(p).tensors)
    want = clone_state(old)
    for rank in (0, 1):
        for k, bx in _part_boxes(rank).items():
            sl = tuple(slice(o, o + e) for o, e in bx)
            want[k][sl] = new[k][sl]
    state = b.to(old)
    staged = stage(state, parts)
    with b.active():
        assemble.apply_parts(state, staged)
        assert not verify.mismatched(state, staged), "the records' digests do not check after apply"
    assert same_bits(state, want)
    refused = 0
    for k in range(4):  # a part's chunk corrupted behind renewed CRCs
        bad = corrupt(parts[k % 2], k, 7 * k + 3, (91 * k + 17) % 256)
        state = b.to(old)
        try:
            staged = stage(state, [bad, parts[1]] if k % 2 == 0 else [parts[0], bad])
        except WeightTeleportError:
            refused += 1
            assert same_bits(state, old), f"corruption {k} refused but the state changed"
            continue
        with b.active():
            assemble.apply_parts(state, staged)
        assert same_bits(state, want), f"corruption {k} accepted and the result is wrong"
    assert refused >= 2


def test_worker_slices_stage_in_part(gpu_backend):
    """The two ranks of a TP=2 layout stage their slices on the GPU path (records staged in
    part: runs of chunks against narrowed live tensors, checked against their chunk
    digests): rows through contiguous views, columns of row-parallel layers through strided
    views written in place; a snapshot, sparse and dense deltas, each chained ahead of the
    pause: bit-exact. A run of chunks corrupted behind renewed CRCs is refused with nothing
    written, or (a byte no decoder reads) gives the right weights."""
    from test_slice_stage import CONFIG, TP, _mutate, _state, engine_params

    from weight_teleport import Publisher, PublisherConfig
    from weight_teleport.format.manifest import from_json
    from weight_teleport.store import open_store
    from weight_teleport.targets.slice_stage import apply_steps, stage_entry
    from weight_teleport.targets.vllm_layout import slice_hints, worker_slices

    b = gpu_backend
    gen = torch.Generator().manual_seed(3)
    states = [_state(gen)]
    for density in (0.02, 0.5, 0.01):
        states.append(_mutate(states[-1], density, gen))
    url = f"memory://conformance-slices-{uuid.uuid4().hex[:12]}"
    with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [TP]), threads=1)) as pub:
        for v, st in enumerate(states, start=1):
            pub.publish(st, version=v).wait()
    store = open_store(url)
    entries = [e for e in from_json(store.get_manifest()).entries if e.version == 1 or e.kind == "delta"]
    for rank in range(TP):
        slices = worker_slices(CONFIG, TP, rank)
        params = b.to(engine_params(_state(torch.Generator().manual_seed(9)), rank))
        chain = []
        with b.active():
            for e in entries:
                chain.append(stage_entry(store, e, params, slices, pending=chain))
            assert all(type(p).__name__ == "DevicePatch" for step in chain for p in step.patches)
            assert any(type(g).__name__ == "WalkGroup" for step in chain for p in step.patches for g in p.groups), (
                "no column-parallel shard was written by a walk scatter"
            )
            apply_steps(params, chain)
        assert same_bits(params, engine_params(states[-1], rank)), f"rank {rank}"
    delta = entries[1]
    data = store.get(delta.key)
    refused = 0
    for k in range(6):
        store.put(delta.key + f".bad{k}", corrupt(data, k, 5 * k + 1, (37 * k + 11) % 256))
        entry = dataclasses.replace(delta, key=delta.key + f".bad{k}")
        for rank in range(TP):
            params = b.to(engine_params(states[0], rank))
            before = clone_state(params)
            try:
                with b.active():
                    step = stage_entry(store, entry, params, worker_slices(CONFIG, TP, rank))
            except WeightTeleportError:
                refused += 1
                assert same_bits(params, before), f"corruption {k}: refused on rank {rank} but its weights changed"
                continue
            with b.active():
                apply_steps(params, [step])
            assert same_bits(params, engine_params(states[1], rank)), f"corruption {k}: accepted on rank {rank}"
    assert refused >= 4, f"only {refused} of 12 corrupt stages refused"


# --- digests and kernels ------------------------------------------------------------------------

INTERPRETED_DIGESTS = [torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float64]
"""The interpreter's digests: a type of each width (the digest reads words, whatever the type)."""


@pytest.mark.parametrize(
    "gpu_backend,dtype",
    [
        *[
            pytest.param(CUDA, dt, id=f"{CUDA}-{str(dt).removeprefix('torch.')}", marks=[pytest.mark.cuda])
            for dt in DTYPES
        ],
        *[
            pytest.param(INTERPRETER, dt, id=f"{INTERPRETER}-{str(dt).removeprefix('torch.')}")
            for dt in INTERPRETED_DIGESTS
        ],
    ],
    indirect=["gpu_backend"],
)
def test_digests_are_the_cpus(gpu_backend, dtype):
    """The GPU path's digests of tensors and views (off 8-byte alignment, strided), of one
    word to several programs' words (16,384 words a program), are the CPU backend's."""
    from weight_teleport.codec.cpu import backend as cpu
    from weight_teleport.codec.cuda import backend as gpu

    for n in (0, 1, 3, 8, 1001, 70001):
        t = make_pair(n, dtype, (n,), "random", "none", "ulp", 0.0)[0]
        for view in (slice(None), slice(1, None), slice(None, None, 2)):
            assert gpu.digest(gpu_backend.tensor(t)[view]) == cpu.digest(t[view]), (n, view)


def test_word_sums_of_many_tensors_are_their_digests(gpu_backend):
    """One launch over many tensors, whole-word ones read in place and the others (off an
    8-byte boundary, a ragged last word, empty, non-contiguous) as padded copies: each sum
    gives the CPU's digest."""
    from weight_teleport.codec.cuda.kernels.digest import word_sums

    to = gpu_backend.tensor
    big = to(make_pair(5, torch.bfloat16, (70000,), "random", "none", "ulp", 0.0)[0])
    tensors = [
        big,
        big[4:40004],
        big[1:3001],
        big[:1001],
        big[:0],
        big[::3][:4000],
        to(make_pair(6, torch.float64, (1234,), "random", "none", "ulp", 0.0)[0]),
        to(make_pair(7, torch.float8_e4m3fn, (4096,), "random", "none", "ulp", 0.0)[0]),
    ]
    for subset in (tensors, tensors[:2]):  # with copies among them, or views only
        for t, s in zip(subset, word_sums(subset).cpu().tolist()):
            assert D.to_hex(D.finish(s & D.MASK64, t.numel() * t.element_size())) == tensor_digest(t.cpu())


def test_walk_copy_is_torchs(gpu_backend):
    """Runs of 2-D walk views (column blocks walked by columns or by rows, row blocks walked
    by columns: several tiles each way, edges partial) copied by tiles are torch's copy of
    the same walk."""
    from weight_teleport.codec.cuda.kernels import walk_copy
    from weight_teleport.codec.cuda.live import walk_2d

    t = gpu_backend.tensor(torch.arange(150 * 140, dtype=torch.int16).view(150, 140))
    for k, view in enumerate((t.t(), t[:, 20:90].t(), t[:, 20:90], t[10:140].t(), t.t()[7:100])):
        flat = view.contiguous().view(-1)
        for start, count in ((0, flat.numel()), (131, 4099), (flat.numel() - 65, 65), (64, 0)):
            out = walk_copy.copy_walk(
                view, torch.empty(count, dtype=torch.int16, device=t.device), start, walk_2d(view)
            )
            assert torch.equal(out, flat[start : start + count]), (k, start, count)


def test_crc32_of_byte_ranges_is_zlibs(gpu_backend):
    """The GPU CRC-32 of awkward byte ranges (empty, one byte, a program and a piece more; on
    a GPU also ranges around the 256-byte piece and of many programs, unaligned starts) is
    zlib's, with the ranges given on the host or on the device (the launch sized by bounds;
    programs past a range's end add nothing)."""
    from weight_teleport.codec.cuda.kernels.crc import crc32

    if gpu_backend.name == INTERPRETER:  # a byte a step: no program, one, two (the first piece partial)
        data, offsets, lengths = crc_ranges(lengths=(0, 1, 32769))
    else:
        data, offsets, lengths = crc_ranges(0)
        big = np.random.default_rng(0).integers(0, 256, 9_000_000, dtype=np.uint8)  # ranges of many programs
        data, offsets, lengths = (
            np.concatenate([data, big]),
            np.append(offsets, [data.size, data.size + 1]),
            np.append(lengths, [big.size, big.size - 7]),
        )
    want = [zlib.crc32(data[o : o + n]) for o, n in zip(offsets, lengths)]
    on = gpu_backend.tensor(torch.from_numpy(data))
    assert crc32(on, offsets, lengths).cpu().numpy().view(np.uint32).tolist() == want
    ranges = gpu_backend.tensor(torch.from_numpy(np.stack([offsets, lengths])))
    bounds = lengths + np.array([0, 1, 40000] * lengths.size)[: lengths.size]
    assert crc32(on, ranges[0], ranges[1], bounds).cpu().numpy().view(np.uint32).tolist() == want


def test_chunk_tables_are_the_format_writers(gpu_backend):
    """Chunk tables written by the GPU's kernel (random group counts, groups with and
    without streams, varints of 1 to 7 bytes) are the format writer's."""
    assert chunk_table_failures(gpu_backend.device) == []


def test_per_tensor_sums_are_numpys(gpu_backend):
    """ChunkTable.per_tensor (runs of rows, one atomic add per column where a run lies in one
    tensor) against numpy's sums mod 2^64: int32 and int64 rows, values that wrap, tensors
    without chunks, runs across tensor boundaries."""
    from weight_teleport.codec.cuda.kernels import chunk_table

    rng = np.random.default_rng(7)
    sizes = [0, 1, 5000, 0, 37, 10000, 3, 0]
    table = chunk_table.build([torch.empty(n, dtype=torch.int16, device=gpu_backend.device) for n in sizes], 64, 16)
    for dtype, cols in ((np.int32, (1000,)), (np.int64, (2,)), (np.int64, ()), (np.int32, (70,))):
        info = np.iinfo(dtype)
        rows = rng.integers(info.min, info.max, size=(table.programs, *cols), dtype=dtype, endpoint=True)
        got = table.per_tensor(gpu_backend.tensor(torch.from_numpy(rows))).cpu().numpy()
        want = np.zeros((len(sizes), *cols), np.uint64)
        np.add.at(want, table.program_tensor.cpu().numpy(), rows.astype(np.int64).view(np.uint64))
        assert got.shape == want.shape and np.array_equal(got.view(np.uint64), want), (dtype.__name__, cols)


@pytest.mark.parametrize("extra,malformed", [(0, False), (1, True)])
def test_decoder_refuses_a_gap_past_the_largest_chunk(gpu_backend, extra, malformed):
    """One event whose gap value v is 2^22 (the largest a chunk of 2^22 elements holds: bucket
    43, extra bits 0) decodes; v = 2^22 + 1, which no chunk holds, is malformed."""
    dec, v = decode_one_gap(extra, gpu_backend.device)
    assert bool(dec.malformed) == malformed
    assert malformed or decoded_one_gap(dec, v)


@pytest.mark.parametrize("n", [0, 1, 33, 5000, 100_003])
def test_bitmap_prefix_is_the_exclusive_popcount_prefix(gpu_backend, n):
    from weight_teleport.codec.cuda.kernels import stage_bitmap

    words = torch.from_numpy(np.random.default_rng(n).integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32))
    words[::5], words[1::7] = -1, 0
    got = stage_bitmap.prefix(gpu_backend.tensor(words))
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert np.array_equal(got.cpu().numpy(), popcount_prefix(words.numpy()))


@pytest.mark.parametrize("gpu_backend", params([INTERPRETER]), indirect=True)
def test_inflate_fills_the_cpu_paths_buffer(gpu_backend, monkeypatch):
    """The GPU stage's inflate (layout walk, gather of the stored bytes, one decompress call
    over the zstd streams, length checks) fills the same buffer as the CPU path, nvCOMP's
    batched call stood in by the CPU's zstd (nvCOMP has no CPU build; on a GPU the real one
    runs: tests/codec/test_codec_cuda.py)."""
    import zstandard

    from weight_teleport.codec.cuda.kernels import stream_tables
    from weight_teleport.codec.cuda.runtime import nvcomp
    from weight_teleport.codec.cuda.stage import decode_streams

    old, new = pair(torch.float32, 6000, 0.3, 21)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=4096)
    header = read_header(pack)
    rec = header.tensors[0]
    assert rec.codec == "sparse"
    starts = np.array([header.payload_offset + c.offset for c in rec.chunks], np.int64)
    lengths = np.array([c.length for c in rec.chunks], np.int64)
    k = np.full(starts.size, max(c for _, c in rec.classes) + 1, np.int64)
    st = stream_tables.read(np.frombuffer(pack, np.uint8), starts, lengths, k, 16)
    assert (st.codec == 1).any(), "no zstd streams"
    want = decode_streams.inflate(pack, st, "cpu")

    class Done:
        def __init__(self, sizes):
            self.order, self.sizes = np.arange(len(sizes)), sizes

        def host(self):
            return torch.tensor(self.sizes, dtype=torch.int64), torch.zeros(len(self.sizes), dtype=torch.int32)

    def plan_decompress(cfg, offsets, stored, dst_offsets, raw, stream, codec):
        table = np.stack([offsets, stored, raw, dst_offsets]).astype(np.int64)
        return nvcomp.DecompressPlan(np.arange(raw.size), [(0, raw.size, "zstd")], [0], table)

    def decompress(cfg, src, dst, plan):
        sizes = []
        for o, n, r, d in plan.table.T.tolist():
            out = zstandard.ZstdDecompressor().decompress(src[o : o + n].numpy().tobytes(), max_output_size=r)
            dst[d : d + len(out)] = torch.frombuffer(bytearray(out), dtype=torch.uint8)
            sizes.append(len(out))
        return Done(sizes)

    monkeypatch.setattr(nvcomp, "available", lambda: True)
    monkeypatch.setattr(nvcomp, "plan_decompress", plan_decompress)
    monkeypatch.setattr(nvcomp, "decompress", decompress)
    got = decode_streams.inflate(pack, st, "cpu")
    n = want.buffer.numel() - decode_streams.PAD
    assert np.array_equal(got.offsets, want.offsets) and torch.equal(got.buffer[:n], want.buffer[:n])
    assert not bool(got.failed)


# --- golden bytes per codec ---------------------------------------------------------------------


def _golden_pack(codec: str, b) -> bytes:
    """Backend `b`'s pack of test_format_golden's small states that holds a record of `codec`."""
    old, new = _states()
    with b.active():
        if codec == "dense_values":
            return bytes(wt.encode_snapshot(b.inputs({"w": new["w"]}), version=2, chunk_elems=8))
        if codec == "dense_residual":  # every element steps of 1 to 251 up: a dense delta of residuals
            steps = torch.tensor([37 * i % 251 + 1 for i in range(18)], dtype=torch.int16).view(3, 6)
            new = {"w": (bits(old["w"]) + steps).view(torch.bfloat16), "i": new["i"]}
        return bytes(
            wt.encode_delta(
                b.inputs(old),
                b.inputs(new),
                base_version=1,
                version=2,
                chunk_elems=8,
                codec=codec if codec in CHOICES else "sparse",
                **portable(b),
            )
        )


def _goldens() -> dict:
    """Each codec of the registry: the bytes of its pack of `_golden_pack`, or (length, sha256)
    of them. The container's own codecs are tests/format/test_format_golden.py's; every other
    codec's are in its own test module, tests/codec/test_codec_*.py, as `CODEC_GOLDEN` (a
    change is a format change: docs/FORMAT.md)."""
    found = {
        "same": GOLDEN_DELTA,
        "sparse": GOLDEN_DELTA,
        "dense_values": GOLDEN_SNAPSHOT,
        "dense_residual": GOLDEN_DENSE_RESIDUAL,
    }
    for path in sorted(Path(__file__).parent.glob("test_codec_*.py")):
        found.update(getattr(importlib.import_module(path.stem), "CODEC_GOLDEN", {}))
    return found


GOLDEN = _goldens()


def test_golden_bytes_cover_every_codec():
    assert set(GOLDEN) == set(CODECS)


@pytest.mark.parametrize("codec", list(CODECS))
def test_golden_bytes_per_codec(backend, codec):
    """Every backend writes each codec's pack of a small delta (or snapshot) to the same
    golden bytes (the CUDA backend with the CPU's zstd for its streams), which hold a record
    of that codec and decode to the new state."""
    pack = _golden_pack(codec, backend)
    assert codec in {t.codec for t in read_header(pack).tensors}
    want = GOLDEN[codec]
    if isinstance(want, bytes):
        assert pack == want
    else:
        assert (len(pack), hashlib.sha256(pack).hexdigest()) == want
