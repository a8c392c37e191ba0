"""Worker-local staging of versions made of parts (trainer ranks' packs), without an engine:
the two ranks of a TP=2 Qwen3-shaped layout each stage a chain of versions whose parts three
trainer ranks wrote in a layout unlike the engine's (columns of what the engine splits by
rows and the other way round, uneven, tensors on one rank alone), reading only the parts
that overlap their slices; after applying, each rank holds exactly the trainer's weights in
its layout, on the CPU and (marked `cuda`) in plain CUDA tensors. A version with a part
missing from the manifest is refused, nothing written."""

import pytest
import torch

from helpers import bits
from test_slice_stage import CONFIG, DEVICES, TP, _mutate, _state, engine_params
from test_subscriber_parts import part
from weight_teleport.codec import TensorSlice, encode_delta, encode_snapshot
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.format.manifest import parts_entry
from weight_teleport.store import NotFound, open_store
from weight_teleport.targets.slice_stage import HEADER_PROBE, apply_steps, stage_entry
from weight_teleport.targets.vllm_layout import slice_hints, worker_slices

TRAINERS = 3
HINTS = slice_hints(CONFIG, [1, TP])


def trainer_split(name: str, shape: tuple, hints: dict, trainers: int) -> tuple[int, list] | None:
    """(dim, [(rank, extent), ...]) of a tensor split over trainer ranks; None: on one rank.
    What the engine splits by rows (`hints`: walked by rows) the trainers split by columns,
    and the other way round (3/8 : 5/8, ranks 0 and 1); with 3 trainers gate_proj's rows go
    to ranks 0 and 2, so that rank 2's part holds rows of the second sampler rank alone."""
    if len(shape) == 1:
        return None
    if trainers == 3 and name.endswith("gate_proj.weight"):
        return 0, [(0, shape[0] // 2), (2, shape[0] - shape[0] // 2)]
    dim = 0 if hints[name].order == "cols" else 1
    first = shape[dim] * 3 // 8
    return dim, [(0, first), (1, shape[dim] - first)]


def trainer_shard(state: dict, rank: int, hints: dict = HINTS, trainers: int = TRAINERS) -> tuple[dict, dict]:
    """Trainer rank `rank`'s local tensors and their slices (norms on rank 0, q_norm and
    k_norm on rank 1)."""
    local, slices = {}, {}
    for name, t in state.items():
        split = trainer_split(name, tuple(t.shape), hints, trainers)
        if split is None:
            if rank == (1 if "_norm" in name and "self_attn" in name else 0):
                local[name] = t
            continue
        held = rank_piece(t, split, rank)
        if held is not None:
            local[name], slices[name] = held
    return local, slices


def rank_piece(t: torch.Tensor, split: tuple[int, list], rank: int) -> tuple[torch.Tensor, TensorSlice] | None:
    """Rank `rank`'s piece of `t` split as `trainer_split` says, and its box; None: none."""
    dim, pieces = split
    start = 0
    for r, extent in pieces:
        if r == rank:
            box = [(0, d) for d in t.shape]
            box[dim] = (start, extent)
            return t.narrow(dim, start, extent).contiguous(), TensorSlice(tuple(t.shape), box)
        start += extent
    return None


def publish_parts(store, states: list) -> list:
    """A snapshot made of parts for version 1, then a delta made of parts per version."""
    entries = []
    for v, new in enumerate(states, start=1):
        kind, base, parts = ("snapshot" if v == 1 else "delta"), (None if v == 1 else v - 1), []
        for rank in range(TRAINERS):
            local, slices = trainer_shard(new, rank)
            hints = {k: HINTS[k] for k in local}
            opts = dict(chunk_elems=256, threads=1, slices=slices, hints=hints)
            if kind == "delta":
                old, _ = trainer_shard(states[v - 2], rank)
                pack = encode_delta(old, local, base_version=base, version=v, **opts)
            else:
                pack = encode_snapshot(local, version=v, **opts)
            parts.append(part(store, v, kind, base, pack, rank))
        entries.append(parts_entry(v, kind, base, tuple(parts), 0))
    return entries


def _stage_chain(store, entries, rank: int, device: str = "cpu") -> dict:
    slices = worker_slices(CONFIG, TP, rank)
    params = {
        n: p.to(device)
        for n, p in engine_params(_state(torch.Generator().manual_seed(9)), rank).items()  # not the trainer's weights
    }
    chain = []
    for e in entries:  # all staged before any is applied
        chain.append(stage_entry(store, e, params, slices, pending=chain))
        touched = sum(p.size for p in e.parts)
        assert chain[-1].fetched <= (1 / TP + 0.1) * touched + len(e.parts) * HEADER_PROBE
    apply_steps(params, chain)
    return params


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_stage_their_slices_of_versions_made_of_parts(tmp_path, device):
    gen = torch.Generator().manual_seed(0)
    states = [_state(gen)]
    for density in (0.02, 0.2, 0.01):
        states.append(_mutate(states[-1], density, gen))
    store = open_store(f"file://{tmp_path}")
    entries = publish_parts(store, states)
    assert all(len(e.parts) == TRAINERS for e in entries)
    for rank in (1, 0):  # rank 0 last: after rank 2's parts are gone
        params = _stage_chain(store, entries, rank, device)
        want = engine_params(states[-1], rank)
        for name in want:
            assert params[name].device.type == device
            assert torch.equal(bits(params[name].cpu()), bits(want[name])), (rank, name)
        if rank == 1:  # sampler rank 0 holds none of trainer rank 2's rows: it never reads them
            for e in entries:
                store.delete(e.parts[2].key)
    with pytest.raises(NotFound):
        _stage_chain(store, entries, 1)


def test_a_version_missing_a_part_is_refused(tmp_path):
    gen = torch.Generator().manual_seed(1)
    old = _state(gen)
    new = _mutate(old, 0.05, gen)
    store = open_store(f"file://{tmp_path}")
    _, delta = publish_parts(store, [old, new])
    short = parts_entry(2, "delta", 1, delta.parts[:2], 0)
    for rank in range(TP):
        params, slices = engine_params(old, rank), worker_slices(CONFIG, TP, rank)
        with pytest.raises(ObjectRejected, match="do not cover"):
            stage_entry(store, short, params, slices)
        apply_steps(params, [stage_entry(store, delta, params, slices)])
        want = engine_params(new, rank)
        assert all(torch.equal(bits(params[n]), bits(want[n])) for n in want)
