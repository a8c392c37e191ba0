"""Expert-parallel trainers publish without gathering: two trainer ranks in a gloo group each
hold their experts of a tiny Qwen3-MoE whole and their share of every other tensor, and
publish them as their part of each version (`PublisherGroup`, an anchor then deltas in
which every expert moves, routed or not). Two sampler ranks of vLLM's layout, with expert
parallelism and without, stage the versions from the parts alone: each reads only the parts
and chunks of its slices (its own experts under EP), and after applying holds exactly the
trainer's weights in vLLM's stacked parameters."""

from __future__ import annotations


import pytest
import torch

from helpers import bits
from services import gloo_rank, run_ranks
from test_slice_parts import rank_piece, trainer_split
from test_slice_stage import _mutate
from test_vllm_moe_layout import STAGE, engine_params, experts_of, owners
from weight_teleport.format.manifest import from_json
from weight_teleport.store import open_store
from weight_teleport.targets.slice_stage import HEADER_PROBE, apply_steps, stage_entry
from weight_teleport.targets.vllm_layout import slice_hints, worker_slices

TRAINERS = 2
SAMPLERS = 2
HINTS = slice_hints(STAGE, [SAMPLERS], expert_parallel=(False, True))
WAIT_S = 300


def versions() -> list[dict[str, torch.Tensor]]:
    """The trainer's weights of each version (the same seed in every process)."""
    gen = torch.Generator().manual_seed(0)
    shapes = {s.name: s.shape for s in worker_slices(STAGE, 1, 0).values()}
    states = [{n: torch.randn(shape, generator=gen).to(torch.bfloat16) for n, shape in shapes.items()}]
    for density in (0.02, 0.2, 0.01):
        states.append(_mutate(states[-1], density, gen))
    return states


def expert_of(name: str) -> int | None:
    """The expert a checkpoint tensor belongs to (None: not an expert's)."""
    if ".experts." not in name:
        return None
    return int(name.split(".experts.")[1].split(".")[0])


def trainer_shard(state: dict, rank: int) -> tuple[dict, dict]:
    """Trainer rank `rank`'s tensors and their boxes: its experts whole (expert parallel, the
    same contiguous placement as the samplers'), every other tensor split between the ranks
    across the way the samplers split it (`trainer_split`), vectors on rank 0."""
    mine = set(owners(experts_of(STAGE), TRAINERS, True)[rank])
    local, slices = {}, {}
    for name, t in state.items():
        expert = expert_of(name)
        if expert is not None:
            if expert in mine:
                local[name] = t
            continue
        split = trainer_split(name, tuple(t.shape), HINTS, TRAINERS)
        if split is None:
            if rank == 0:
                local[name] = t
            continue
        held = rank_piece(t, split, rank)
        if held is not None:
            local[name], slices[name] = held
    return local, slices


def _trainer(rank: int, port: int, url: str, errors) -> None:
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import PublisherGroup

    with gloo_rank(rank, port, TRAINERS, errors):
        config = PublisherConfig(anchor_every=10, threads=1, chunk_elems=256)
        with PublisherGroup(url, config, hints=HINTS) as group:
            for v, state in enumerate(versions(), start=1):
                local, slices = trainer_shard(state, rank)
                group.publish(local, v, slices=slices)


def _publish(url: str) -> None:
    codes, found = run_ranks(_trainer, TRAINERS, url, timeout=WAIT_S)
    assert not found, "\n".join(found)
    assert codes == [0] * TRAINERS


@pytest.mark.parametrize("ep", [False, True])
def test_expert_parallel_trainers_feed_sampler_ranks_their_experts(tmp_path, ep):
    url = f"file://{tmp_path}"
    _publish(url)
    store = open_store(url)
    entries = from_json(store.get_manifest()).entries
    assert [e.version for e in entries] == [1, 2, 3, 4] and all(len(e.parts) == TRAINERS for e in entries)
    for e in entries:  # a trainer's part covers its own experts alone: nothing was gathered
        for r, part in enumerate(e.parts):
            experts = {expert_of(name) for name, _ in part.covers} - {None}
            assert experts == set(owners(experts_of(STAGE), TRAINERS, True)[r]), (e.version, r)
    states = versions()
    for rank in range(SAMPLERS):
        slices = worker_slices(STAGE, SAMPLERS, rank, ep)
        params = engine_params({n: torch.zeros_like(t) for n, t in states[0].items()}, slices)
        steps = []
        for e in entries:  # all staged before any is applied
            steps.append(stage_entry(store, e, params, slices, pending=steps))
            touched = sum(p.size for p in e.parts)
            assert steps[-1].fetched <= (1 / SAMPLERS + 0.1) * touched + len(e.parts) * HEADER_PROBE, (
                rank,
                e.version,
                steps[-1].fetched,
                touched,
            )
        apply_steps(params, steps)
        want = engine_params(states[-1], slices)
        assert set(params) == set(want)
        for name in want:
            assert torch.equal(bits(params[name]), bits(want[name])), (ep, rank, name)
