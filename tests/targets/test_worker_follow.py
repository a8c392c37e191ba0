"""An engine worker's follower runs the subscriber's follow loop, without an engine or a
process group (one rank of a TP=2 layout; the board read as a commit reads it): it refuses
a store that went back below the version it holds, manifests its keys did not sign and
malformed ones, with its health saying so and nothing staged; it resyncs from the anchor
when the store lists the version it holds under another object; a failed stage posted for
a version is tried again as soon as a vote waits for it, however long its backoff."""

import shutil
import time

import pytest
import torch

from helpers import bits
from test_slice_stage import CONFIG, TP, _mutate, _state, engine_params
from weight_teleport.codec.slices import chunk_byte_ranges, chunk_window
from weight_teleport.format import read_header
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.store import open_store
from weight_teleport.targets import worker_follow
from weight_teleport.targets.slice_stage import apply_steps, held_box
from weight_teleport.targets.vllm_layout import slice_hints, worker_slices
from weight_teleport.targets.worker_local import TeleportInitInfo, WorkerLocal

WAIT_S = 120.0


def _states(n: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    states = [_state(gen)]
    states += [_mutate(states[-1], 0.03, gen) for _ in range(n - 1)]
    return states


def _publish(url: str, states: list[dict], **config) -> list:
    """Versions 1..n of `states`; the manifest after each."""
    manifests = []
    with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [TP]), threads=1, **config)) as pub:
        for v, st in enumerate(states, start=1):
            pub.publish(st, version=v).wait()
            manifests.append(open_store(url).get_manifest())
    return manifests


def _worker(url: str, state: dict, rank: int = 0, initial: int | None = 1, **info) -> tuple[WorkerLocal, dict]:
    params = engine_params(state, rank)
    worker = WorkerLocal(lambda: params, worker_slices(CONFIG, TP, rank), rank, None, torch.device("cpu"))
    worker.start(TeleportInitInfo(url, initial_version=initial, watch_timeout_s=0.1, **info))
    return worker, params


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _refused_twice(worker: WorkerLocal) -> bool:
    health = worker.status()["health"]
    return health["state"] == "failing" and health["consecutive_failures"] >= 2


def _applied(worker: WorkerLocal, params: dict, version: int) -> dict:
    """What a commit of `version` writes: the chain this rank posted for it, applied."""
    entry = worker.board.wait(version, WAIT_S)
    assert entry is not None and entry.error is None, entry
    apply_steps(params, entry.patch)
    return params


def _same(params: dict, state: dict, rank: int = 0) -> bool:
    want = engine_params(state, rank)
    return all(torch.equal(bits(params[n]), bits(t)) for n, t in want.items())


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(worker_follow, "RETRY_S", 0.01)
    monkeypatch.setattr(worker_follow, "RETRY_MAX_S", 0.05)


def test_a_worker_refuses_a_store_that_went_back(tmp_path, quick_retries):
    """A manifest older than the version applied is refused, never planned from (its anchor
    is older than what a commit may apply): health failing, nothing staged, until the store
    is ahead again."""
    url, states = f"file://{tmp_path}", _states(4, 0)
    manifests = _publish(url, states[:3], anchor_every=100)
    worker, params = _worker(url, states[2], initial=3)
    try:
        _until(lambda: worker.status()["health"]["state"] == "healthy", "the worker to be up to date")
        open_store(url).put_manifest(manifests[0])
        _until(lambda: _refused_twice(worker), "the rolled-back manifest to be refused")
        status = worker.status()
        assert "older than version 3" in status["health"]["last_error"], status
        assert "init the engine's weight transfer again" in status["health"]["last_error"]
        assert status["staged"] == [] and status["fetched"] == {}
        with Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [TP]), threads=1, resume=False)) as pub:
            pub.publish(states[3], version=4).wait()  # an anchor past the version held
        assert _same(_applied(worker, params, 4), states[3])
        assert worker.status()["health"]["state"] == "healthy"
    finally:
        worker.shutdown()


def test_a_worker_trusts_only_manifests_its_keys_signed(tmp_path, quick_retries):
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from weight_teleport.format.signing import generate_keypair

    def pem(raw: bytes) -> str:
        return (
            ed25519.Ed25519PublicKey.from_public_bytes(raw)
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )

    (private, public), (_, other) = generate_keypair(), generate_keypair()
    url, states = f"file://{tmp_path}", _states(2, 1)
    _publish(url, states, signing_key=private)
    trusting, params = _worker(url, states[0], trusted_keys=[pem(public)])
    foreign, _ = _worker(url, states[0], trusted_keys=[pem(other)])
    try:
        assert _same(_applied(trusting, params, 2), states[1])
        _until(lambda: _refused_twice(foreign), "the foreign-signed manifest to be refused")
        status = foreign.status()
        assert "signed by key" in status["health"]["last_error"] and "refusing" in status["errors"][0]
        assert status["staged"] == [] and status["fetched"] == {}
    finally:
        trusting.shutdown()
        foreign.shutdown()


def test_a_worker_refuses_a_malformed_manifest_until_it_is_repaired(tmp_path, quick_retries):
    url, states = f"file://{tmp_path}", _states(3, 2)
    manifests = _publish(url, states)
    open_store(url).put_manifest(b'{"not": "a manifest"}')
    worker, params = _worker(url, states[0])
    try:
        _until(lambda: _refused_twice(worker), "the malformed manifest to be refused")
        assert worker.status()["staged"] == []
        open_store(url).put_manifest(manifests[-1])
        assert _same(_applied(worker, params, 3), states[2])
        _until(lambda: worker.status()["health"]["state"] == "healthy", "health to recover")
    finally:
        worker.shutdown()


def test_a_worker_resyncs_when_its_version_names_other_weights(tmp_path):
    """The store is reset to another run whose version 2 is other weights: the chain staged
    on the old run's version 2 is dropped with its posts, and the new run's anchor staged."""
    url, other_url = f"file://{tmp_path}/store", f"file://{tmp_path}/other"
    states, others = _states(2, 3), _states(3, 4)
    _publish(url, states)
    manifest = _publish(other_url, others)[-1]
    worker, params = _worker(url, states[0], initial=None)  # no weights: from the anchor
    try:
        _until(lambda: 2 in worker.status()["staged"], "the first run's version 2 to be staged")
        shutil.copytree(tmp_path / "other" / "objects", tmp_path / "store" / "objects", dirs_exist_ok=True)
        open_store(url).put_manifest(manifest)
        _until(lambda: 3 in worker.status()["staged"], "the second run's version 3 to be staged")
        assert any("resync" in e for e in worker.status()["errors"])
        assert _same(_applied(worker, params, 3), others[2])
    finally:
        worker.shutdown()


def test_a_failed_stage_is_tried_again_for_a_vote_at_once(tmp_path, monkeypatch):
    """A chunk of version 2 that rank 1 reads is corrupt: its failure is posted and its
    health degrades. The store is repaired; a vote (a new epoch of the board) has the stage
    tried again without waiting out the backoff, and the vote gets the staged version."""
    monkeypatch.setattr(worker_follow, "RETRY_S", 1e6)
    monkeypatch.setattr(worker_follow, "RETRY_MAX_S", 1e6)
    url, states = f"file://{tmp_path}", _states(2, 5)
    _publish(url, states)
    store = open_store(url)
    entry = next(e for e in _entries(store) if e.version == 2)
    path = tmp_path / "objects" / entry.key
    good = path.read_bytes()
    header = read_header(good)
    name = "model.layers.0.mlp.down_proj.weight"
    rec = next(r for r in header.tensors if r.name == name)
    _, i, j = chunk_window(header, rec, held_box(worker_slices(CONFIG, TP, 1)[name]))
    lo, hi = chunk_byte_ranges(header, rec, i, j)[0]  # its first run of bytes
    bad = bytearray(good)
    bad[(lo + hi) // 2] ^= 0x40
    path.write_bytes(bytes(bad))
    worker, params = _worker(url, states[0], rank=1)
    try:
        _until(lambda: worker.status()["health"]["consecutive_failures"] >= 1, "the stage to fail")
        status = worker.status()
        assert status["health"]["state"] == "degraded" and "CRC" in status["health"]["last_error"]
        path.write_bytes(good)
        assert _same(_applied(worker, params, 2), states[1], rank=1)
        _until(lambda: worker.status()["health"]["state"] == "healthy", "health to recover")
    finally:
        worker.shutdown()


def _entries(store) -> list:
    from weight_teleport.format.manifest import from_json

    return list(from_json(store.get_manifest()).entries)
