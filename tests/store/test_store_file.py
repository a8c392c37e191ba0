"""The file store's atomicity and layout, the registry, and the base's retries."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from weight_teleport.store import (
    Conflict,
    MissingDependency,
    NotFound,
    RetryConfig,
    Store,
    StoreConfig,
    StoreError,
    TransportError,
    open_store,
    register_store,
)
from weight_teleport.store.file import LOCK_NAME, AtomicFile, FileStore
from weight_teleport.store.memory import MemoryStore


def leftovers(root: Path) -> list[str]:
    """Temp files left anywhere under `root` (the manifest's lock file is meant to stay)."""
    return [str(p) for p in root.rglob(".*") if p.name != LOCK_NAME]


def test_layout_and_no_temp_files(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    assert isinstance(store, FileStore)
    store.put("v/1", b"abc")
    store.put_manifest(b"m")
    assert (tmp_path / "objects" / "v" / "1").read_bytes() == b"abc"
    assert (tmp_path / "manifest").read_bytes() == b"m"
    assert leftovers(tmp_path) == []


def test_a_url_without_scheme_is_refused(tmp_path: Path) -> None:
    for url in [str(tmp_path), "origin:8000", "localhost:8000/weights", "weights"]:
        with pytest.raises(StoreError, match="no scheme: write file:///absolute/path"):
            open_store(url)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "objects" / "x"
    with pytest.raises(RuntimeError):
        with AtomicFile(target, overwrite=False) as f:
            f.write(b"partial")
            raise RuntimeError("writer crashed")
    assert not target.exists()
    assert leftovers(tmp_path) == []


def test_readers_never_see_partial_objects(tmp_path: Path) -> None:
    writer, reader = FileStore(tmp_path), FileStore(tmp_path)
    blobs = {f"o/{i}": bytes([i]) * (256 << 10) for i in range(40)}
    seen_partial: list[str] = []
    done = threading.Event()

    def read_all() -> None:
        while not done.is_set():
            for key in reader.list("o/"):
                if reader.get(key) != blobs[key]:
                    seen_partial.append(key)

    thread = threading.Thread(target=read_all)
    thread.start()
    for key, data in blobs.items():
        writer.put(key, data)
    done.set()
    thread.join()
    assert seen_partial == []
    assert reader.list("o/") == sorted(blobs)


def test_manifest_replace_is_atomic(tmp_path: Path) -> None:
    writer, reader = FileStore(tmp_path), FileStore(tmp_path)
    versions = [bytes([i]) * 100_000 for i in range(30)]
    writer.put_manifest(versions[0])
    seen: set[bytes] = set()
    done = threading.Event()

    def read_all() -> None:
        while not done.is_set():
            seen.add(reader.get_manifest())

    thread = threading.Thread(target=read_all)
    thread.start()
    for data in versions[1:]:
        writer.put_manifest(data)
    done.set()
    thread.join()
    assert seen <= set(versions)


def test_memory_stores_share_by_name() -> None:
    a, b = open_store("memory://shared-test"), open_store("memory://shared-test")
    assert isinstance(a, MemoryStore)
    a.put("k", b"v")
    assert b.get("k") == b"v"
    assert open_store("memory://other-test").list() == []


def test_missing_dependency_has_install_hint() -> None:
    register_store("needs-extra", "weight_teleport.store.not_installed:Store", "s3")
    with pytest.raises(MissingDependency, match=r'pip install "weight-teleport\[s3\]"'):
        open_store("needs-extra://x")


def test_unknown_scheme() -> None:
    with pytest.raises(StoreError, match="unknown store URL scheme"):
        open_store("nosuchscheme://x")


class FlakyStore(MemoryStore):
    """A memory store whose gets fail `failures` times before working."""

    def __init__(self, failures: int, config: StoreConfig):
        super().__init__(f"flaky-{id(self)}", config)
        self.failures, self.calls = failures, 0

    def _get(self, key: str) -> bytes:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransportError("connection reset")
        return super()._get(key)


FAST_RETRY = StoreConfig(retry=RetryConfig(attempts=3, backoff_s=0.001))


def test_transient_errors_are_retried() -> None:
    store = FlakyStore(2, FAST_RETRY)
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert store.calls == 3


def test_retries_give_up() -> None:
    store: Store = FlakyStore(3, FAST_RETRY)
    store.put("k", b"v")
    with pytest.raises(TransportError):
        store.get("k")


def test_keys_cannot_escape_root(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    for key in ["../escape", "a/../../escape", "/etc/passwd"]:
        with pytest.raises(StoreError):
            store.put(key, b"x")
    assert sorted(os.listdir(tmp_path)) == []


def test_key_used_as_directory_conflicts(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("a", b"1")
    store.put("b/c", b"2")
    for key in ["a/x", "b"]:
        with pytest.raises(Conflict, match="directory"):
            store.put(key, b"3")
        with pytest.raises(NotFound):
            store.get(key)
        with pytest.raises(NotFound):
            store.delete(key)
    assert store.list() == ["a", "b/c"]
