"""The manifest parser is a parser of untrusted input: every malformed manifest raises
ManifestError (nothing else), within a size bound, before any entry is used."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weight_teleport.pipeline.errors import ManifestError
from weight_teleport.format.manifest import FORMAT, MAX_MANIFEST_BYTES, Entry, Manifest, from_json

SHA = "ab" * 32


def good_entries() -> list[dict]:
    return [
        {
            "version": 0,
            "kind": "snapshot",
            "base": None,
            "key": "packs/0/s.pack",
            "size": 10,
            "sha256": SHA,
            "raw_bytes": 100,
        },
        {
            "version": 1,
            "kind": "delta",
            "base": 0,
            "key": "packs/1/d.pack",
            "size": 5,
            "sha256": "cd" * 32,
            "raw_bytes": 100,
        },
    ]


def doc(**changes) -> dict:
    d = {"format": FORMAT, "latest": 1, "model": {}, "entries": good_entries()}
    d.update(changes)
    return d


def entry(**changes) -> dict:
    d = doc()
    d["entries"][1].update(changes)
    return d


def raw(d) -> bytes:
    return json.dumps(d).encode()


def test_a_good_manifest_parses() -> None:
    m = from_json(raw(doc()))
    assert m.latest == 1 and m.entries[1] == Entry(1, "delta", 0, "packs/1/d.pack", 5, "cd" * 32, 100)


@pytest.mark.parametrize(
    "bad, why",
    [
        (entry(version="1"), "version"),  # a string version
        (entry(version=1.0), "not an integer"),  # a float version
        (entry(version=True), "version"),  # a bool is not an int here
        (entry(version=-1), "version"),
        (entry(version=1 << 63), "version"),
        (entry(base="0"), "base"),
        (entry(size=0), "size"),  # a pack is never empty
        (entry(size=2**70), "size"),
        (entry(raw_bytes=-5), "raw_bytes"),
        (entry(key="../escape"), "invalid key"),
        (entry(key="/abs"), "invalid key"),
        (entry(key=""), "invalid key"),
        (entry(key=7), "invalid key"),
        (entry(key="a/" + "b" * 2000), "invalid key"),
        (entry(sha256="AB" * 32), "sha256"),  # uppercase
        (entry(sha256="zz" * 32), "sha256"),
        (entry(sha256="ab"), "sha256"),
        (entry(sha256=None), "sha256"),
        (entry(kind="patch"), "kind"),
        (entry(extra=1), "unknown"),
        (doc(entries=[{"version": 0}]), "missing"),
        (doc(entries=[[0, "snapshot"]]), "not an object"),
        (doc(entries={"0": 1}), "not a list"),
        (doc(latest=5), "latest"),
        (doc(latest="1"), "latest"),
        (doc(latest=True), "latest"),
        (doc(model=[]), "model"),
        (doc(format="other/1"), "not a weight-teleport-manifest/1"),
        (doc(more=1), "unknown"),
        ({"format": FORMAT}, "missing"),
        ([1, 2], "not an object"),
        (entry(base=1), "later base"),  # consistency checks still apply
        (doc(entries=good_entries()[::-1]), "out of order"),
    ],
)
def test_malformed_fields_raise_manifest_error(bad, why: str) -> None:
    with pytest.raises(ManifestError, match=why):
        from_json(raw(bad))


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # RecursionError inside
        (raw(doc()).replace(b'"model": {}', b'"model": {"a": NaN}'), "not an integer"),
        (raw(doc()).replace(b'"model": {}', b'"model": {"a": 1, "a": 2}'), "repeats a key"),
        (b'{"format": "weight-teleport-manifest/1", "latest": 1' + b"9" * 5000 + b"}", "not JSON"),
    ],
)
def test_hostile_bytes_raise_manifest_error(data: bytes, why: str) -> None:
    with pytest.raises(ManifestError, match=why):
        from_json(data)


def with_files(*files: dict, on: int = 0) -> dict:
    d = doc()
    d["entries"][on]["files"] = list(files)
    return d


def side(name: str = "config.json", **changes) -> dict:
    return {"name": name, "key": "files/ab/" + "config.json", "size": 2, "sha256": SHA, **changes}


def test_side_files_and_retention_parse_and_sign() -> None:
    from weight_teleport.format.signing import ManifestSigner, generate_keypair

    d = with_files(side(), side("tokenizer.json"))
    d["retention"] = {"keep_anchors": 2, "removed_through": None}
    d["entries"][1]["published_at_ms"] = 1_700_000_000_000
    m = from_json(raw(d))
    assert [f.name for f in m.entries[0].files] == ["config.json", "tokenizer.json"]
    assert m.retention.keep_anchors == 2 and m.entries[1].published_at_ms == 1_700_000_000_000
    signer = ManifestSigner(generate_keypair()[0])
    signed = m.to_json(sign=signer)
    assert from_json(signed, verify=signer.verifier()) == m
    tampered = json.loads(signed)
    tampered["entries"][0]["files"][0]["name"] = "generation_config.json"
    with pytest.raises(ManifestError, match="signature"):
        from_json(raw(tampered), verify=signer.verifier())


@pytest.mark.parametrize(
    "bad, why",
    [
        (with_files(side("../config.json")), "plain file name"),
        (with_files(side("a/b")), "plain file name"),
        (with_files(side(".hidden")), "plain file name"),
        (with_files(side("model.safetensors")), "plain file name"),
        (with_files(side(7)), "plain file name"),
        (with_files(side(), side()), "twice"),
        (with_files(side(), on=1), "only snapshots"),
        (with_files(side(key="../x")), "invalid key"),
        (with_files(side(sha256="x")), "sha256"),
        (with_files(side(size=-1)), "size"),
        (with_files({"name": "config.json"}), "a file is not"),
        (with_files(*[side(f"f{i}") for i in range(65)]), "at most"),
        (doc(retention={"keep_anchors": -1, "removed_through": None}), "keep_anchors"),
        (doc(retention={"keep_anchors": 1}), "retention"),
        (entry(published_at_ms=1.5), "not an integer"),
    ],
)
def test_malformed_side_files_and_retention_raise(bad, why: str) -> None:
    with pytest.raises(ManifestError, match=why):
        from_json(raw(bad))


def test_size_is_bounded_before_parsing() -> None:
    with pytest.raises(ManifestError, match="limit"):
        from_json(b" " * (MAX_MANIFEST_BYTES + 1))
    with pytest.raises(ManifestError, match="limit"):
        from_json(raw(doc()), max_bytes=50)


def test_round_trip_of_what_the_publisher_writes() -> None:
    m = Manifest(tuple(Entry(**e) for e in good_entries()), {"names": ["a", "b"]})
    assert from_json(m.to_json()) == m


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["version", "kind", "base", "key", "size", "sha256", "raw_bytes", "x"]), _json, max_size=8
    )
)
def test_fuzzed_entries_raise_only_manifest_error(fields: dict) -> None:
    d = doc()
    d["entries"][1] = {**d["entries"][1], **fields}
    try:
        m = from_json(raw(d))
    except ManifestError:
        return
    e = m.entries[1]  # accepted: then every field has its type and range
    assert type(e.version) is int and type(e.size) is int and e.size > 0
    assert e.base is None or type(e.base) is int
    assert len(e.sha256) == 64 and e.kind in ("delta", "snapshot")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | _json.map(lambda v: json.dumps(v).encode()))
def test_fuzzed_documents_raise_only_manifest_error(data: bytes) -> None:
    try:
        from_json(data)
    except ManifestError:
        pass
