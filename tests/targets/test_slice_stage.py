"""Worker-local staging without an engine: the two ranks of a TP=2 Qwen3-shaped layout
(fused qkv_proj / gate_up_proj, column-, row- and vocab-parallel shards) each stage the
packs a real Publisher writes to a file store, from their own slices alone, chained ahead
of applying; after applying, each rank's parameters hold exactly the trainer's weights in
that layout, on the CPU and (marked `cuda`) in plain CUDA tensors. A chunk corrupted in the
store fails only the rank that fetches it."""

import torch
import pytest

from helpers import bits
from weight_teleport.errors import PackFormatError
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.format.manifest import from_json
from weight_teleport.store import open_store
from weight_teleport.targets.slice_stage import apply_steps, held_box, stage_entry
from weight_teleport.targets.slice_view import box_view, walk_view
from weight_teleport.targets.vllm_layout import slice_hints, worker_slices

CONFIG = {
    "model_type": "qwen3",
    "vocab_size": 200,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": False,
}
TP = 2


def _walk(t: torch.Tensor, s) -> torch.Tensor:
    return t[s.lo : s.hi].reshape(-1) if s.order == "rows" else t[:, s.lo : s.hi].t().reshape(-1)


def engine_params(state: dict, rank: int) -> dict:
    """What a vLLM worker's loader makes of checkpoint `state`: its own parameters."""
    slices = worker_slices(CONFIG, TP, rank)
    params = {}
    for s in slices.values():
        params.setdefault(s.param, torch.zeros(s.param_shape, dtype=torch.bfloat16))
    for name, s in slices.items():
        view = walk_view(params[s.param], s)
        view.copy_(_walk(state[name], s).view(view.shape) if s.order == "rows" else state[name][:, s.lo : s.hi].t())
    return params


def _state(gen) -> dict:
    shapes = {n: s.shape for n, s in worker_slices(CONFIG, TP, 0).items()}
    return {n: torch.randn(shape, generator=gen).to(torch.bfloat16) for n, shape in shapes.items()}


def _mutate(state: dict, density: float, gen) -> dict:
    out = {}
    for n, t in state.items():
        b = t.view(torch.int16).clone()
        b[torch.rand(t.shape, generator=gen) < density] += 1
        out[n] = b.view(torch.bfloat16)
    return out


def _entries(store) -> list:
    return list(from_json(store.get_manifest()).entries)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda)"),
        ],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_stage_their_slices_of_chained_versions(tmp_path, device):
    """Rows (fused qkv / gate_up parts, column- and vocab-parallel shards) and columns of
    row-parallel layers (o_proj, down_proj), staged against the worker's own tensors."""
    gen = torch.Generator().manual_seed(0)
    url = f"file://{tmp_path}"
    states = [_state(gen)]
    for density in (0.02, 0.2, 0.01):
        states.append(_mutate(states[-1], density, gen))
    with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [1, TP]), threads=1)) as pub:
        for v, st in enumerate(states, start=1):
            pub.publish(st, version=v).wait()
    store = open_store(url)
    entries = [e for e in _entries(store) if e.version == 1 or e.kind == "delta"]
    for rank in range(TP):
        slices = worker_slices(CONFIG, TP, rank)
        params = {
            n: p.to(device)
            for n, p in engine_params(  # not the trainer's weights
                _state(torch.Generator().manual_seed(9)), rank
            ).items()
        }
        chain = []
        for e in entries:  # all staged before any is applied
            chain.append(stage_entry(store, e, params, slices, pending=chain))
            assert chain[-1].fetched <= (1 / TP + 0.1) * e.size + (16 << 10)
        apply_steps(params, chain)
        want = engine_params(states[-1], rank)
        for name in want:
            assert params[name].device.type == device
            assert torch.equal(bits(params[name].cpu()), bits(want[name])), (rank, name)


def test_a_corrupt_chunk_fails_only_the_rank_that_fetches_it(tmp_path):
    gen = torch.Generator().manual_seed(1)
    url = f"file://{tmp_path}"
    old = _state(gen)
    new = _mutate(old, 0.05, gen)
    with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [TP]), threads=1)) as pub:
        pub.publish(old, version=1).wait()
        entry = pub.publish(new, version=2).wait().objects[0]
    path = tmp_path / "objects" / entry.key
    data = bytearray(path.read_bytes())
    from weight_teleport.codec.slices import chunk_byte_ranges, chunk_window
    from weight_teleport.format import read_header

    header = read_header(bytes(data))
    name = "model.layers.0.mlp.down_proj.weight"
    rec = next(r for r in header.tensors if r.name == name)
    _, i, j = chunk_window(header, rec, held_box(worker_slices(CONFIG, TP, 1)[name]))
    lo, hi = chunk_byte_ranges(header, rec, i, j)[0]  # its first run of bytes
    data[(lo + hi) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    store = open_store(url)
    for rank in range(TP):
        params, slices = engine_params(old, rank), worker_slices(CONFIG, TP, rank)
        before = {n: p.clone() for n, p in params.items()}
        if rank == 0:
            apply_steps(params, [stage_entry(store, entry, params, slices)])
            assert torch.equal(bits(params[name]), bits(engine_params(new, 0)[name]))
        else:
            with pytest.raises(PackFormatError, match="CRC"):
                stage_entry(store, entry, params, slices)
            assert all(torch.equal(bits(params[n]), bits(before[n])) for n in params)


def test_a_short_object_is_refused_before_its_buffer_is_taken(tmp_path):
    """The manifest's size and the header's chunk offsets are the store's word: an object
    that ends before the chunks the header points at is refused (typed), nothing written."""
    from weight_teleport.pipeline.errors import ObjectRejected

    gen = torch.Generator().manual_seed(2)
    old = _state(gen)
    url = f"file://{tmp_path}"
    with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [TP]), threads=1)) as pub:
        pub.publish(old, version=1).wait()
        entry = pub.publish(_mutate(old, 0.05, gen), version=2).wait().objects[0]
    path = tmp_path / "objects" / entry.key
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    params = engine_params(old, 1)
    before = {n: p.clone() for n, p in params.items()}
    with pytest.raises(ObjectRejected, match="ends before byte"):
        stage_entry(open_store(url), entry, params, worker_slices(CONFIG, TP, 1))
    assert all(torch.equal(bits(params[n]), bits(before[n])) for n in params)


def test_held_views_follow_the_parameters_and_die_with_their_owner():
    """A worker's views of its parameters are made once, made again for parameters an engine
    replaced, and kept by their owner alone: parameters the worker let go are freed."""
    import gc
    import weakref

    from weight_teleport.targets.slice_stage import HeldViews

    slices = worker_slices(CONFIG, TP, 0)
    params = engine_params(_state(torch.Generator().manual_seed(3)), 0)
    views = HeldViews(slices)
    state, held = views.of(params)
    assert views.of(dict(params))[0] is state  # the same tensors: the same views
    name = next(n for n, s in slices.items() if s.order == "cols")
    assert held[name].box == held_box(slices[name])
    assert state[name].data_ptr() == box_view(params[slices[name].param], slices[name]).data_ptr()
    replaced = {n: t.clone() for n, t in params.items()}
    assert views.of(replaced)[0] is not state
    gone = weakref.ref(replaced[slices[name].param])
    del views, state, held, replaced
    gc.collect()
    assert gone() is None
