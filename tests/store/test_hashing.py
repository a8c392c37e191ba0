"""The SHA-256 tree of stored objects, and fetching large objects in parallel ranges."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from weight_teleport.pipeline import fetch as F
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.format.manifest import Entry, ManifestError, from_json, make_entry
from weight_teleport.store import open_store
from weight_teleport.store.hashing import TreeHasher, object_hash, tree_sha256


def _reference(data: bytes, piece: int) -> str:
    digests = b"".join(hashlib.sha256(data[i : i + piece]).digest() for i in range(0, len(data), piece))
    return hashlib.sha256(digests).hexdigest()


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=5000), st.sampled_from([1, 7, 64, 1024]), st.lists(st.integers(0, 700), max_size=8))
def test_tree_hash_matches_its_definition_in_any_cuts(data: bytes, piece: int, cuts: list[int]) -> None:
    assert tree_sha256(data, piece) == _reference(data, piece)
    hasher, at = TreeHasher(piece), 0
    for n in cuts + [len(data)]:
        hasher.update(data[at : at + n])
        at += n
    assert hasher.size == len(data) and hasher.hexdigest() == _reference(data, piece)


def test_plain_sha256_for_old_entries_and_tree_for_new() -> None:
    assert object_hash(b"abc", 0) == hashlib.sha256(b"abc").hexdigest()
    entry = make_entry(1, "snapshot", None, b"x" * 100, 100)
    assert entry.piece_bytes == 8 << 20 and entry.sha256 == _reference(b"x" * 100, 8 << 20)


@pytest.mark.parametrize("piece", [3, 1 << 15, 3 << 20, 1 << 31, -1, True])
def test_manifest_refuses_bad_piece_sizes(piece) -> None:
    doc = (
        '{"format": "weight-teleport-manifest/1", "latest": 0, "model": {}, "entries": '
        '[{"version": 0, "kind": "snapshot", "base": null, "key": "packs/s", "size": 1, '
        f'"sha256": "{"a" * 64}", "piece_bytes": {str(piece).lower()}}}]}}'
    )
    with pytest.raises(ManifestError):
        from_json(doc.encode())


def _stored(tmp_path, data: bytes, piece: int, scheme: str = "file") -> tuple[str, Entry]:
    url = f"file://{tmp_path}" if scheme == "file" else f"memory://hashing-{tmp_path.name}"
    with open_store(url) as store:
        store.put("packs/big", data)
    entry = Entry(0, "snapshot", None, "packs/big", len(data), tree_sha256(data, piece), 0, piece)
    return url, entry


@pytest.mark.parametrize("scheme", ["file", "memory"])  # memory: ranges copied straight in
def test_ranged_fetch_is_exact_and_refuses_short_or_corrupted_objects(tmp_path, monkeypatch, scheme) -> None:
    monkeypatch.setattr(F, "RANGE_BYTES", 1 << 16)
    monkeypatch.setattr(F, "_check_header", lambda entry, data: None)  # not a pack: bytes only
    data = os.urandom((1 << 18) + 12345)
    url, entry = _stored(tmp_path, data, 1 << 14, scheme)
    with open_store(url) as store:
        got = F.fetch(store, entry)
        assert isinstance(got, np.ndarray) and got.tobytes() == data
        allocated = []
        monkeypatch.setattr(F, "_buffer", lambda n, pinned: allocated.append(n) or np.empty(n, np.uint8))
        longer = Entry(0, "snapshot", None, "packs/big", len(data) + 1, entry.sha256, 0, entry.piece_bytes)
        with pytest.raises(ObjectRejected, match="truncated"):
            F.fetch(store, longer)
        assert allocated == []  # refused before the entry's size was allocated
        wrong = Entry(0, "snapshot", None, "packs/big", len(data), "0" * 64, 0, entry.piece_bytes)
        with pytest.raises(ObjectRejected, match="content hash"):
            F.fetch(store, wrong)


@settings(max_examples=40, deadline=None)
@given(
    st.binary(max_size=5000),
    st.sampled_from([1, 7, 64, 1024]),
    st.lists(st.integers(0, 700), max_size=8),
    st.sampled_from(["exact", "unknown", "short"]),
)
def test_upload_sink_writes_and_hashes_any_cuts(
    tmp_path_factory, data: bytes, piece: int, cuts: list[int], announced: str
) -> None:
    """The origin's upload path: the file holds the bytes fed, the hash is the tree's, for
    any cuts, whether the body's length is known, unknown or announced too short."""
    import asyncio

    from weight_teleport.server.upload import PieceSink
    from weight_teleport.store.file import AtomicFile

    expected = {"exact": len(data), "unknown": None, "short": len(data) // 2}[announced]
    path = tmp_path_factory.mktemp("sink") / "object"

    async def feed() -> str:
        out = AtomicFile(path, overwrite=False)
        sink, at = PieceSink(out, expected=expected, piece_bytes=piece, depth=2), 0
        for n in cuts + [len(data)]:
            await sink.feed(data[at : at + n])
            at += n
        digest = await sink.finish()
        out.commit()
        return digest

    assert asyncio.run(feed()) == _reference(data, piece)
    assert path.read_bytes() == data
