"""Subscribers following versions made of parts (one process, real file:// stores): parts
written as trainer ranks write them (uneven row shards, column shards walked by columns,
records cut at a sampler's bounds, a tensor one rank alone holds, tied weights) reassemble
bit for bit into a full model, from a cold start on anchor parts, and on CUDA weights (marked
`cuda`); malformed parts are refused with typed errors and the target never holds a half or
mixed version."""

from __future__ import annotations

import json
import time

import pytest
import torch

from helpers import bits
from weight_versions import FAST
from weight_teleport.codec import Hint, TensorSlice, encode_delta, encode_snapshot
from weight_teleport.format import read_header
from weight_teleport.subscribe import Subscriber
from weight_teleport.pipeline.fetch import fetch_parts
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.fetch import materialize
from weight_teleport.format.manifest import Manifest, from_json, object_key, parts_entry
from weight_teleport.format.parts import Part
from weight_teleport.store import open_store
from weight_teleport.store.hashing import PIECE_BYTES, tree_sha256
from weight_teleport.targets.torch import TorchTarget

WORLD = 3
WAIT_S = 30.0
SHAPES = {"emb": (13, 8), "up": (11, 8), "down": (8, 11), "bias": (5,)}
SPLIT = {"emb": 0, "up": 0, "down": 1}
"""Tensor -> the dim its ranks split (uneven: 13, 11 over 3); "bias" lives on rank 0 alone."""
HINTS = {"down": Hint("cols", (8 * 5,)), "up": Hint("rows", (8 * 5,))}
"""A sampler's bound at column 5 of "down" and row 5 of "up": rank 1's records are cut there."""


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    out = {k: (torch.randn(s, generator=g) * 0.1).to(torch.bfloat16) for k, s in SHAPES.items()}
    for v in range(1, version + 1):
        g = torch.Generator().manual_seed(100 + v)
        for k, t in out.items():
            u = t.view(torch.int16).clone()
            u[torch.rand(t.shape, generator=g) < 0.2] += 1
            out[k] = u.view(torch.bfloat16)
    out["head"] = out["emb"]  # tied: published under both names
    return out


def shard(state: dict, rank: int) -> tuple[dict, dict]:
    """Rank `rank`'s local tensors and their slices."""
    local, slices = {}, {}
    for name, t in state.items():
        dim = SPLIT.get("emb" if name == "head" else name)
        if dim is None:
            if rank == 0:
                local[name] = t
            continue
        pieces = torch.tensor_split(t, WORLD, dim)
        box = [(0, d) for d in t.shape]
        box[dim] = (sum(p.shape[dim] for p in pieces[:rank]), pieces[rank].shape[dim])
        local[name], slices[name] = pieces[rank].contiguous(), TensorSlice(t.shape, box)
    return local, slices


def part(store, version: int, kind: str, base, pack: bytes, rank: int) -> Part:
    digest = tree_sha256(pack, PIECE_BYTES)
    key = object_key(version, kind, base, pack, digest).replace(".pack", f"-r{rank}.pack")
    store.put(key, pack)
    covers = tuple(
        (r.name, tuple(map(tuple, r.box)) if r.box is not None else tuple((0, d) for d in r.shape))
        for r in read_header(pack).tensors
    )
    return Part(key, len(pack), digest, covers, PIECE_BYTES)


def version_parts(store, version: int, kind: str) -> tuple[Part, ...]:
    out = []
    for rank in range(WORLD):
        new, slices = shard(weights(version), rank)
        hints = {k: h for k, h in HINTS.items() if k in new}
        if kind == "delta":
            old, _ = shard(weights(version - 1), rank)
            pack = encode_delta(
                old,
                new,
                base_version=version - 1,
                version=version,
                chunk_elems=16,
                threads=1,
                slices=slices,
                hints=hints,
            )
        else:
            pack = encode_snapshot(new, version=version, chunk_elems=16, threads=1, slices=slices, hints=hints)
        out.append(part(store, version, kind, version - 1 if kind == "delta" else None, pack, rank))
    return tuple(out)


def announce(store, manifest: Manifest, *entries) -> Manifest:
    manifest = manifest.with_entries(*entries)
    store.put_manifest(manifest.to_json())
    return manifest


def publish(store, manifest: Manifest, version: int, anchor: bool = False) -> Manifest:
    entries = []
    if version:
        entries.append(parts_entry(version, "delta", version - 1, version_parts(store, version, "delta"), 0))
    if anchor or not version:
        entries.append(parts_entry(version, "snapshot", None, version_parts(store, version, "snapshot"), 0))
    return announce(store, manifest, *entries)


def zeros() -> dict[str, torch.Tensor]:
    live = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in SHAPES.items()}
    live["head"] = live["emb"]
    return live


def same(live: dict, version: int) -> bool:
    return all(torch.equal(bits(live[k].cpu()), bits(t)) for k, t in weights(version).items())


def follow(sub: Subscriber, live: dict, version: int) -> list[int]:
    """Apply until the target holds `version`, every applied version checked bit for bit."""
    seen, deadline = [], time.monotonic() + WAIT_S
    while sub.version != version:
        assert time.monotonic() < deadline, f"stuck at {sub.version}: {sub.health}"
        if sub.wait(0.1):
            sub.apply()
            seen.append(sub.version)
            assert same(live, sub.version), sub.version
    return seen


class ShadowTarget(TorchTarget):
    """A TorchTarget that lends no view (as weights over several devices): the subscriber
    stages against a shadow copy and the target writes flat chunks."""

    def checkpoint_view(self):
        return None


@pytest.mark.parametrize("target", [TorchTarget, ShadowTarget])
def test_parts_reassemble_bit_exact_from_a_cold_start_on_anchor_parts(tmp_path, target, monkeypatch):
    """Versions made of parts, followed and from a cold start, which parses each part's
    header once (when it checks it)."""
    from weight_teleport.codec import api
    from weight_teleport.pipeline import fetch as F

    url = f"file://{tmp_path}/store"
    store, manifest, live = open_store(url), Manifest(), zeros()
    manifest = publish(store, manifest, 0)
    with Subscriber(url, target(live), FAST) as sub:
        follow(sub, live, 0)
        for v in (1, 2, 3):
            manifest = publish(store, manifest, v, anchor=v == 2)
            assert follow(sub, live, v) == [v]
        assert sub.stats.resyncs == 0 and sub.stats.objects_rejected == 0
    live2, parsed = zeros(), []
    for mod in (api, F):
        real = mod.read_header
        monkeypatch.setattr(mod, "read_header", lambda *a, real=real, **k: parsed.append(1) or real(*a, **k))
    with Subscriber(url, target(live2), FAST) as late:  # a cold start from version 2's anchor parts
        follow(late, live2, 3)
        assert late.stats.objects_fetched == 2
    fetched = [e for e in manifest.entries if (e.version, e.kind) in ((2, "snapshot"), (3, "delta"))]
    assert len(parsed) == sum(len(e.parts) for e in fetched) > 2
    monkeypatch.undo()
    state, _ = materialize(store, manifest, 3, threads=1)
    assert all(torch.equal(bits(state[k]), bits(t)) for k, t in weights(3).items())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda)")
def test_parts_stage_on_the_gpu_against_cuda_weights(tmp_path):
    """A CUDA view: each part's records staged on the GPU against the walk views of their
    boxes, chunks cut where the records' cuts say."""
    url = f"file://{tmp_path}/store"
    store = open_store(url)
    manifest = publish(store, Manifest(), 0)
    assert any(r.cuts for p in manifest.entries[-1].parts for r in read_header(store.get(p.key)).tensors)
    live = {k: t.cuda() for k, t in zeros().items() if k != "head"}
    live["head"] = live["emb"]
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        assert sub._stager.on_cuda
        follow(sub, live, 0)
        for v in (1, 2, 3):
            manifest = publish(store, manifest, v, anchor=v == 2)
            assert follow(sub, live, v) == [v]
        assert sub.stats.resyncs == 0 and sub.stats.objects_rejected == 0


def _doctored(url, edit) -> None:
    store = open_store(url)
    doc = json.loads(store.get_manifest())
    edit(doc["entries"][-1]["parts"])
    store.put_manifest(json.dumps(doc).encode())


def _swap_covers(parts):
    parts[0]["covers"], parts[1]["covers"] = parts[1]["covers"], parts[0]["covers"]


def _drop_part(parts):
    del parts[1]


@pytest.mark.parametrize("edit, why", [(_swap_covers, "its records cover"), (_drop_part, "do not cover")])
def test_malformed_parts_are_refused_and_nothing_half_applied(tmp_path, edit, why):
    url = f"file://{tmp_path}/store"
    store, live = open_store(url), zeros()
    manifest = publish(store, publish(store, Manifest(), 0), 1)
    _doctored(url, edit)
    with pytest.raises(ObjectRejected, match=why):
        fetch_parts(store, from_json(store.get_manifest()).entries[-1])
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        follow(sub, live, 0)
        deadline = time.monotonic() + WAIT_S
        while sub.stats.objects_rejected < 2:
            assert time.monotonic() < deadline, sub.health
            if sub.wait(0.05):
                sub.apply()
        assert sub.version == 0 and same(live, 0)
        store.put_manifest(manifest.to_json())  # repaired: the version arrives whole
        follow(sub, live, 1)


def test_a_part_of_another_version_is_refused(tmp_path):
    url = f"file://{tmp_path}/store"
    store = open_store(url)
    manifest = publish(store, publish(store, publish(store, Manifest(), 0), 1), 2)
    doc = json.loads(manifest.to_json())
    doc["entries"][-1]["parts"][1] = doc["entries"][-2]["parts"][1]  # version 1's part in version 2
    with pytest.raises(Exception, match="listed twice"):
        from_json(json.dumps(doc).encode())
    entry = manifest.entries[-1]
    mixed = parts_entry(2, "delta", 1, (entry.parts[0], manifest.entries[-2].parts[1]) + entry.parts[2:], 0)
    with pytest.raises(ObjectRejected, match="holds a delta to version 1"):
        fetch_parts(store, mixed)
