"""The contract every store passes: memory, file, http (the origin), s3 (SeaweedFS)."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from services import S3_BUCKET, TOKEN, origin, s3_config, seaweed_s3  # noqa: F401
from weight_teleport.store import (
    Conflict,
    InvalidKey,
    ManifestChanged,
    NotFound,
    Store,
    StoreConfig,
    StoreError,
    TooLarge,
    manifest_etag,
    open_store,
)
from weight_teleport.store import http as http_store
from weight_teleport.store.http import HttpStore
from weight_teleport.store.keys import content_hash

BACKENDS = ["memory", "file", "http", "s3"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path) -> Store:
    """A fresh, empty store of each kind."""
    name = uuid.uuid4().hex[:12]
    if request.param == "memory":
        return open_store(f"memory://{name}")
    if request.param == "file":
        return open_store(f"file://{tmp_path / 'store'}")
    if request.param == "http":
        server = request.getfixturevalue("origin")
        return open_store(server.url, StoreConfig(token=TOKEN))
    endpoint = request.getfixturevalue("seaweed_s3")
    return open_store(f"s3://{S3_BUCKET}/{name}", s3_config(endpoint))


ALL_BYTES = bytes(range(256)) * 3


def test_round_trip(store: Store) -> None:
    store.put("v/000001.pack", ALL_BYTES)
    store.put("empty", b"")
    assert store.get("v/000001.pack") == ALL_BYTES
    assert store.get("empty") == b""


def test_put_with_its_content_hash(store: Store) -> None:
    """A caller that hashed the bytes already passes the hash; HTTP checks it, not its own."""
    store.put("hashed", ALL_BYTES, content_hash=content_hash(ALL_BYTES))
    assert store.get("hashed") == ALL_BYTES
    if isinstance(store, HttpStore):
        with pytest.raises(StoreError, match="X-Content-Tree-SHA256"):
            store.put("wrong", ALL_BYTES, content_hash=content_hash(b"other"))
        with pytest.raises(NotFound):
            store.get("wrong")


def test_put_pausing_between_pieces(store: Store, monkeypatch) -> None:
    """An upload streamed in pieces calls back between them (HTTP); the object is whole."""
    monkeypatch.setattr(http_store._Pieces, "PIECE", 1 << 20)
    data = np.random.default_rng(1).integers(0, 256, (5 << 19) + 5, dtype=np.uint8).tobytes()
    calls = []
    store.put("paced", data, between_pieces=lambda: calls.append(1))
    assert store.get("paced") == data
    assert len(calls) == (2 if isinstance(store, HttpStore) else 0)


def test_large_object_and_ranges(store: Store) -> None:
    data = bytes(range(251)) * 12000  # 3 MB: crosses the server's read chunks
    store.put("big", data)
    assert store.get("big") == data
    for start, end in [
        (0, 1),
        (5, 17),
        (1 << 20, (1 << 20) + 4097),
        (len(data) - 3, len(data)),
        (10, len(data) + 100),
        (len(data), len(data) + 5),
        (7, 7),
    ]:
        assert store.get_range("big", start, end) == data[start:end], (start, end)
        out = np.full(max(end - start, 1), 0xAA, np.uint8)  # read straight into a buffer
        got = store.get_range_into("big", start, out[: end - start])
        assert got == len(data[start:end]) and out[:got].tobytes() == data[start:end], (start, end)
        assert (out[got:] == 0xAA).all()  # nothing written past what came
    with pytest.raises(ValueError):
        store.get_range("big", 5, 2)
    with pytest.raises(NotFound):
        store.get_range_into("nope", 0, np.zeros(4, np.uint8))


def test_missing(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get("nope")
    with pytest.raises(NotFound):
        store.get_range("nope", 0, 10)
    with pytest.raises(NotFound):
        store.delete("nope")


def test_list_and_delete(store: Store) -> None:
    for key in ["v/2", "v/10", "anchor/1", "v/1", "vv"]:
        store.put(key, key.encode())
    assert store.list() == ["anchor/1", "v/1", "v/10", "v/2", "vv"]
    assert store.list("v/") == ["v/1", "v/10", "v/2"]
    assert store.list("v/1") == ["v/1", "v/10"]
    assert store.list("v") == ["v/1", "v/10", "v/2", "vv"]
    assert store.list("zzz/") == []
    store.delete("v/10")
    assert store.list("v/") == ["v/1", "v/2"]
    with pytest.raises(NotFound):
        store.get("v/10")


def test_objects_are_immutable(store: Store) -> None:
    store.put("k", b"one")
    store.put("k", b"one")  # an idempotent retry is fine
    with pytest.raises(Conflict):
        store.put("k", b"two")
    assert store.get("k") == b"one"


@pytest.mark.parametrize(
    "key",
    ["", "/abs", "../up", "a/../../b", "a//b", "a/./b", ".hidden", "a\\b", "sp ace", "x" * 2000, "v/" + "s" * 300],
)
def test_invalid_keys(store: Store, key: str) -> None:
    with pytest.raises(InvalidKey):
        store.put(key, b"x")
    with pytest.raises(InvalidKey):
        store.get(key)


def test_manifest(store: Store) -> None:
    assert store.get_manifest() is None
    store.put_manifest(b'{"latest": 1}')
    assert store.get_manifest() == b'{"latest": 1}'
    store.put_manifest(b'{"latest": 2}')
    assert store.get_manifest() == b'{"latest": 2}'


def test_watch(store: Store) -> None:
    assert store.watch(None, timeout=0.2) is None  # no manifest yet
    store.put_manifest(b"m1")
    assert store.watch(None, timeout=0.2) == b"m1"
    assert store.watch("some-older-etag", timeout=0.2) == b"m1"
    started = time.monotonic()
    assert store.watch(manifest_etag(b"m1"), timeout=0.3) is None
    assert time.monotonic() - started >= 0.3


def test_watch_wakes_on_update(store: Store) -> None:
    store.put_manifest(b"m1")
    writer = threading.Timer(0.3, store.put_manifest, args=(b"m2",))
    started = time.monotonic()
    writer.start()
    try:
        assert store.watch(manifest_etag(b"m1"), timeout=10) == b"m2"
    finally:
        writer.join()
    assert time.monotonic() - started < 2.5  # woken up, not timed out


def test_bounded_get(store: Store) -> None:
    data = bytes(range(256)) * 4000  # 1 MB: more than one read of the http store
    store.put("k", data)
    store.put("empty", b"")
    assert store.get("k", max_bytes=len(data)) == data
    assert store.get("empty", max_bytes=0) == b""
    for limit in (0, 100, len(data) - 1):
        with pytest.raises(TooLarge, match="larger than"):
            store.get("k", max_bytes=limit)
    with pytest.raises(NotFound):
        store.get("nope", max_bytes=10)


def test_conditional_manifest(store: Store) -> None:
    store.put_manifest(b"m1", if_match=None)  # the first writer expects no manifest
    with pytest.raises(ManifestChanged, match="another writer"):
        store.put_manifest(b"other", if_match=None)
    store.put_manifest(b"m2", if_match=manifest_etag(b"m1"))
    with pytest.raises(ManifestChanged):
        store.put_manifest(b"m3", if_match=manifest_etag(b"m1"))  # a stale ETag
    assert store.get_manifest() == b"m2"
    # A write repeated after it went through (a lost answer) is not a conflict.
    store.put_manifest(b"m2", if_match=manifest_etag(b"m1"))
    store.put_manifest(b"m4")  # unconditional
    assert store.get_manifest() == b"m4"


def test_one_of_racing_conditional_writers_wins(store: Store) -> None:
    store.put_manifest(b"base")
    etag = manifest_etag(b"base")

    def write(i: int) -> bool:
        try:
            store.put_manifest(b"writer %d" % i, if_match=etag)
            return True
        except ManifestChanged:
            return False

    with ThreadPoolExecutor(6) as pool:
        won = list(pool.map(write, range(6)))
    assert sum(won) == 1
    assert store.get_manifest() == b"writer %d" % won.index(True)


def test_write_access_probe_leaves_nothing(store: Store) -> None:
    store.check_write_access()
    assert store.list() == [] and store.get_manifest() is None
