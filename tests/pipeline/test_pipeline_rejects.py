"""Bad objects in a real file:// store: truncated, corrupted, duplicated, out of order.
Each is rejected before decoding, logged, retried, and never applied."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from weight_versions import expected, same_bits
from weight_versions import FAST, follow, publish
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.format.manifest import Manifest, from_json
from weight_teleport.store import open_store
from weight_teleport.targets.torch import TorchTarget


def _store(tmp_path: Path, versions) -> tuple[str, Manifest]:
    url = f"file://{tmp_path}/store"
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, versions)
    with open_store(url) as store:
        return url, from_json(store.get_manifest())


def _object(tmp_path: Path, key: str) -> Path:
    return tmp_path / "store" / "objects" / key


def _zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(t) for k, t in expected(0).items()}


def _stays_unapplied(sub: Subscriber, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not sub.ready(), "a bad object was staged"
        time.sleep(0.05)


def test_truncated_and_corrupted_objects_are_retried_until_good(tmp_path: Path) -> None:
    url, manifest = _store(tmp_path, range(3))
    snapshot, delta1 = _object(tmp_path, manifest.entries[0].key), _object(tmp_path, manifest.entries[1].key)
    good_snapshot, good_delta = snapshot.read_bytes(), delta1.read_bytes()
    snapshot.write_bytes(good_snapshot[:-100])  # truncated
    flipped = bytearray(good_delta)
    flipped[len(flipped) // 2] ^= 0x10
    delta1.write_bytes(bytes(flipped))  # corrupted, same size
    live = _zeros()
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        _stays_unapplied(sub, 0.5)
        assert sub.stats.objects_rejected >= 2 and sub.version is None
        snapshot.write_bytes(good_snapshot)
        first = follow(sub, 0)
        assert any("truncated" in e for e in first[0].events) and same_bits(live, 0)
        time.sleep(0.3)
        assert not sub.ready() and sub.version == 0
        delta1.write_bytes(good_delta)
        reports = follow(sub, 2)
    assert any("corrupted" in e for r in reports for e in r.events)
    assert same_bits(live, 2)


def test_duplicated_and_out_of_order_objects_are_rejected(tmp_path: Path) -> None:
    url, good = _store(tmp_path, range(4))
    s0, d1, d2, d3 = good.entries
    duplicate = d2.__class__(**{**d2.__dict__, "key": "copies/of-v1", "size": d1.size, "sha256": d1.sha256})
    live = _zeros()
    store = open_store(url)
    store.put(duplicate.key, store.get(d1.key))
    store.put_manifest(Manifest((s0, d1, duplicate, d3)).to_json())
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        follow(sub, 1)
        _stays_unapplied(sub, 0.5)  # v2 is v1's object again
        assert sub.version == 1 and sub.stats.objects_rejected >= 1
        store.put_manifest(Manifest((s0, d1, d3, d2)).to_json())
        _stays_unapplied(sub, 0.3)  # unordered manifest: ignored
        store.put_manifest(good.to_json())
        reports = follow(sub, 3)
    assert same_bits(live, 3)
    assert any("duplicated or out-of-order" in e for r in reports for e in r.events)
    assert any("out of order" in e for r in reports for e in r.events)


def test_fetch_checks_objects_and_falls_back_when_memory_cannot_be_pinned(tmp_path: Path, monkeypatch) -> None:
    """fetch(pinned=True) returns the checked bytes as they came when pinning fails (no GPU
    here, or a limit on page-locked memory); a corrupted object is still rejected."""
    from weight_teleport.pipeline import fetch as F
    from weight_teleport.pipeline.errors import ObjectRejected

    url, manifest = _store(tmp_path, range(2))
    entry = manifest.entries[-1]

    def refuse(_):
        raise RuntimeError("cannot pin memory")

    monkeypatch.setattr(F, "pinned_pack", refuse)
    with open_store(url) as store:
        data = F.fetch(store, entry, pinned=True)
        assert isinstance(data, bytes) and len(data) == entry.size
        path = _object(tmp_path, entry.key)
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 1
        path.write_bytes(bytes(raw))
        with pytest.raises(ObjectRejected, match="content hash"):
            F.fetch(store, entry, pinned=True)
