"""Catch-up deltas from the boot version (`PublisherConfig.catchup_every`): a sampler that
holds the boot version joins with one delta; retention keeps the boot anchor and deletes
superseded catch-up deltas; a resumed publisher goes on making them."""

from __future__ import annotations

import json

import pytest

from weight_versions import FAST, expected, follow, memory_url, publish, same_bits
from weight_teleport.errors import ManifestError
from weight_teleport.format.manifest import FORMAT_BOOT, from_json
from weight_teleport.pipeline import PublisherConfig, RetentionConfig, SubscriberConfig
from weight_teleport.pipeline.errors import ConfigError
from weight_teleport.pipeline.plan import plan_catchup
from weight_teleport.publish import Publisher, PublisherGroup
from weight_teleport.store import NotFound, open_store
from weight_teleport.subscribe import Subscriber
from weight_teleport.targets.torch import TorchTarget


def config(**kw) -> PublisherConfig:
    return PublisherConfig(**{"catchup_every": 4, "anchor_every": 100, **kw})


def manifest(url: str):
    with open_store(url) as store:
        raw = store.get_manifest()
    assert raw is not None
    return from_json(raw)


def test_a_sampler_holding_the_boot_version_joins_with_one_delta() -> None:
    url = memory_url()
    with Publisher(url, config()) as pub:
        publish(pub, range(10))
        m = manifest(url)
        assert m.boot == 0 and m.format == FORMAT_BOOT
        assert [(e.version, e.base) for e in m.catchup_deltas()] == [(8, 0)]  # 4's was superseded
        with pytest.raises(NotFound), open_store(url) as store:
            store.get(next(e.key for e in pub.results[4].objects if e.base == 0))
        state = {k: t.clone() for k, t in expected(0).items()}
        with Subscriber(url, TorchTarget(state), SubscriberConfig(**{**FAST.__dict__, "initial_version": 0})) as sub:
            reports = follow(sub, 9)
        assert [v for r in reports for v in r.versions] == [8, 9]
        assert same_bits(state, 9)
        steps = plan_catchup(m, 0).steps
        assert sum(r.bytes_fetched for r in reports) == sum(e.size for e in steps)
        assert sum(e.size for e in steps) < sum(e.size for e in m.entries if e.kind == "delta" and e.base != 0)


def test_retention_keeps_the_boot_anchor_and_a_resumed_publisher_goes_on() -> None:
    url = memory_url()
    kept = config(anchor_every=3, retention=RetentionConfig(keep_anchors=1))
    with Publisher(url, kept) as pub:
        publish(pub, range(10))
    m = manifest(url)
    assert [e.version for e in m.anchors] == [0, 9]  # the boot anchor and the newest
    assert m.retention is not None and m.retention.removed_through == 8
    assert [(e.version, e.base) for e in m.catchup_deltas()] == [(8, 0)]
    with Publisher(url, kept) as pub:  # fetches the boot version from its anchor
        publish(pub, range(10, 13))
    m = manifest(url)
    assert [(e.version, e.base) for e in m.catchup_deltas()] == [(12, 0)]
    state = {k: t.clone() for k, t in expected(0).items()}
    with Subscriber(url, TorchTarget(state), SubscriberConfig(**{**FAST.__dict__, "initial_version": 0})) as sub:
        reports = follow(sub, 12)
    assert [v for r in reports for v in r.versions] == [12]
    assert same_bits(state, 12)


def test_a_resumed_publisher_without_the_boot_anchor_stops_catching_up() -> None:
    url = memory_url()
    with Publisher(url, config()) as pub:
        publish(pub, range(3))
    with open_store(url) as store:
        store.delete(manifest(url).anchors[0].key)
    with Publisher(url, config()) as pub:  # neither the baseline nor the boot version is readable
        publish(pub, [3])
    m = manifest(url)
    assert m.boot is None and [e.version for e in m.anchors] == [0, 3]


def test_versions_with_other_tensors_end_catch_up() -> None:
    url = memory_url()
    with Publisher(url, config()) as pub:
        publish(pub, range(5))
        other = {k: t for k, t in expected(5).items() if "norm" not in k}
        pub.publish(other, 5)
        assert pub.flush(30)
    m = manifest(url)
    assert m.boot is None and m.catchup_deltas() == []


def test_off_by_default_and_refused_by_a_group() -> None:
    url = memory_url()
    with Publisher(url) as pub:
        publish(pub, range(6))
    m = manifest(url)
    assert m.boot is None and m.format != FORMAT_BOOT
    with pytest.raises(ConfigError, match="catchup_every"):
        PublisherConfig(catchup_every=-1)
    with pytest.raises(ConfigError, match="PublisherGroup"):
        PublisherGroup(memory_url(), PublisherConfig(catchup_every=2))


def _doc(**top) -> dict:
    entry = {"version": 0, "kind": "snapshot", "base": None, "key": "packs/a.pack", "size": 1, "sha256": "a" * 64}
    delta = {"version": 1, "kind": "delta", "base": 0, "key": "packs/b.pack", "size": 1, "sha256": "b" * 64}
    catchup = {"version": 2, "kind": "delta", "base": 0, "key": "packs/c.pack", "size": 1, "sha256": "c" * 64}
    catchup["catchup"] = True
    step = {"version": 2, "kind": "delta", "base": 1, "key": "packs/d.pack", "size": 1, "sha256": "d" * 64}
    doc = {"format": FORMAT_BOOT, "latest": 2, "model": {}, "entries": [entry, delta, catchup, step], "boot": 0}
    doc.update(top)
    return doc


def test_manifest_format_3_round_trips_and_older_formats_refuse_its_members() -> None:
    m = from_json(json.dumps(_doc()).encode())
    assert m.boot == 0 and [e.key for e in m.catchup_deltas()] == ["packs/c.pack"]
    assert from_json(m.to_json()) == m
    for fmt in ("weight-teleport-manifest/1", "weight-teleport-manifest/2"):
        with pytest.raises(ManifestError, match="boot version"):
            from_json(json.dumps(_doc(format=fmt)).encode())
        doc = _doc(format=fmt, boot=None)
        del doc["entries"][2]["catchup"]
        with pytest.raises(ManifestError, match="two deltas"):
            from_json(json.dumps(doc).encode())
    doc = _doc()
    doc["entries"][2], doc["entries"][3] = doc["entries"][3], doc["entries"][2]
    with pytest.raises(ManifestError, match="out of order"):
        from_json(json.dumps(doc).encode())
    doc = _doc()
    doc["entries"][3]["base"] = 0
    with pytest.raises(ManifestError, match="duplicated"):
        from_json(json.dumps(doc).encode())
    for bad in (-1, "0", True, 1.5):
        with pytest.raises(ManifestError):
            from_json(json.dumps(_doc(boot=bad)).encode())
    with pytest.raises(ManifestError, match="not a delta from the boot version"):
        from_json(json.dumps(_doc(boot=1)).encode())
    doc = _doc()
    doc["entries"][2]["catchup"] = 1
    with pytest.raises(ManifestError, match="not true or false"):
        from_json(json.dumps(doc).encode())


def test_pull_from_a_checkpoint_it_holds(tmp_path, capsys) -> None:
    """`pull --from`: from the boot checkpoint (the store's boot version), from an earlier
    pull (the version written in it), from nothing (the boot anchor and the catch-up delta
    are the fewest bytes), and from weights that are not what they claim (the pack's base
    digests refuse them: pulled from an anchor instead). Bit-exact each time."""
    from safetensors.torch import load_file

    from weight_teleport.cli import main
    from weight_teleport.publish.checkpoint import save_checkpoint

    url = f"file://{tmp_path}/store"
    with Publisher(url, config(anchor_every=5)) as pub:
        publish(pub, range(9))
    boot, wrong = tmp_path / "boot", tmp_path / "wrong"
    save_checkpoint(expected(0), boot)
    save_checkpoint(expected(1), wrong)

    def pull(out, *extra) -> str:
        assert main(["pull", url, "--out", str(tmp_path / out), *extra]) == 0
        assert same_bits(load_file(tmp_path / out / "model.safetensors"), 8)
        said = capsys.readouterr()
        return said.out + said.err

    assert [(e.version, e.base) for e in manifest(url).catchup_deltas()] == [(8, 0)]
    assert "(1 objects" in pull("a", "--from", str(boot))  # the catch-up delta 0 -> 8
    assert "(0 objects" in pull("b", "--from", str(tmp_path / "a"))  # version 8, written by the pull
    assert "(2 objects" in pull("c")  # anchor 0 and the catch-up delta: less than anchor 5 and 3 deltas
    said = pull("d", "--from", str(wrong), "--from-version", "0")
    assert "is not version 0" in said and "pulling from an anchor" in said and "(2 objects" in said
    assert main(["status", url]) == 0
    said = capsys.readouterr().out
    assert "boot version 0 (catch-up deltas from it)" in said and "catchup+delta" in said
