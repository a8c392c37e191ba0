"""Manifest and version arithmetic: plain data in, plans out (no stores, no tensors)."""

from __future__ import annotations

import pytest

from weight_teleport.pipeline.errors import ManifestError, NoPlanError
from dataclasses import replace

from weight_teleport.format.manifest import Entry, Manifest, Retention, from_json, make_entry, object_key, side_file
from weight_teleport.pipeline.plan import needs_anchor, plan_avoiding, plan_catchup, unreferenced_keys, plan_retention


def delta(v: int, size: int = 10, base: int | None = None) -> Entry:
    base = v - 1 if base is None else base
    return Entry(v, "delta", base, f"d{v}-{base}", size, f"{v:064x}")


def snap(v: int, size: int = 100) -> Entry:
    return Entry(v, "snapshot", None, f"s{v}", size, f"{v + 1000:064x}")


def log(n: int, anchors=(0,), dsize: int = 10, ssize: int = 100) -> Manifest:
    entries = []
    for v in range(n):
        if v:
            entries.append(delta(v, dsize))
        if v in anchors:
            entries.append(snap(v, ssize))
    return Manifest(tuple(entries))


def keys(plan) -> list[str]:
    return [e.key for e in plan.steps]


def test_json_round_trip_and_latest() -> None:
    m = log(6, anchors=(0, 4))
    back = from_json(m.to_json())
    assert back == m and back.latest == 5 and [a.version for a in back.anchors] == [0, 4]
    assert from_json(Manifest().to_json()).latest is None


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b'{"format": "other/1", "entries": []}',
        b'{"format": "weight-teleport-manifest/1", "entries": [{"version": 1}]}',
    ],
)
def test_malformed_manifest_rejected(bad: bytes) -> None:
    with pytest.raises(ManifestError):
        from_json(bad)


@pytest.mark.parametrize(
    "entries",
    [
        (snap(0), delta(2), delta(1)),  # out of order
        (snap(0), delta(1), delta(1)),  # duplicated version
        (snap(0), snap(0)),  # duplicated anchor
        (snap(0), Entry(1, "delta", None, "x", 1, "0" * 64)),  # delta without base
        (snap(0), Entry(1, "delta", 3, "x", 1, "0" * 64)),  # base after version
        (snap(0), Entry(1, "delta", 0, "s0", 1, "0" * 64)),  # key reused
    ],
)
def test_inconsistent_manifest_rejected(entries) -> None:
    with pytest.raises(ManifestError):
        from_json(Manifest(entries).to_json())


def test_object_keys_name_their_content() -> None:
    a, b = object_key(3, "delta", 2, b"x"), object_key(3, "delta", 2, b"y")
    assert a != b and a.startswith("packs/0000000003/delta-from-0000000002-")
    e = make_entry(0, "snapshot", None, b"abc", 10)
    assert e.size == 3 and e.key == object_key(0, "snapshot", None, b"abc")


def test_new_subscriber_starts_from_latest_anchor() -> None:
    plan = plan_catchup(log(10, anchors=(0, 4, 8)), None)
    assert keys(plan) == ["s8", "d9-8"] and plan.from_anchor and not plan.chain_broken


def test_lagging_subscriber_applies_the_chain_when_cheaper() -> None:
    plan = plan_catchup(log(10, anchors=(0, 4, 8)), 5)
    assert keys(plan) == ["d6-5", "d7-6", "d8-7", "d9-8"] and not plan.from_anchor
    assert plan.nbytes == 40 and plan.target == 9


def test_jump_to_anchor_when_the_chain_costs_more() -> None:
    plan = plan_catchup(log(10, anchors=(0, 8), dsize=30, ssize=100), 1)
    assert keys(plan) == ["s8", "d9-8"] and plan.from_anchor and not plan.chain_broken


def test_up_to_date_and_explicit_target() -> None:
    m = log(10, anchors=(0, 4, 8))
    assert plan_catchup(m, 9).steps == ()
    assert keys(plan_catchup(m, None, target=6)) == ["s4", "d5-4", "d6-5"]
    assert plan_catchup(Manifest(), None).steps == ()


def test_materialize_refuses_a_manifest_without_versions(tmp_path) -> None:
    from weight_teleport.pipeline.fetch import materialize
    from weight_teleport.store import open_store

    with pytest.raises(NoPlanError, match="no version"):
        materialize(open_store(f"file://{tmp_path}"), Manifest())


def test_broken_chain_falls_back_to_an_anchor() -> None:
    kept, _ = plan_retention(log(10, anchors=(0, 4, 8)), keep_anchors=1)
    plan = plan_catchup(kept, 2)
    assert keys(plan) == ["s8", "d9-8"] and plan.chain_broken


def test_ahead_of_the_store_restarts_from_an_anchor() -> None:
    plan = plan_catchup(log(6, anchors=(0, 4)), 40)
    assert keys(plan) == ["s4", "d5-4"]


def test_skipped_versions_chain_by_base() -> None:
    m = Manifest((snap(0), delta(1), delta(5, base=1), delta(6)))
    assert keys(plan_catchup(m, 1)) == ["d5-1", "d6-5"]


def test_excluded_keys_are_planned_around() -> None:
    m = log(10, anchors=(0, 4, 8))
    assert keys(plan_catchup(m, 6, exclude={"d7-6"})) == ["s8", "d9-8"]
    with pytest.raises(NoPlanError):
        plan_catchup(m, 6, exclude={"d9-8"})


def test_set_aside_keys_are_retried_only_when_no_other_plan_exists() -> None:
    m = log(10, anchors=(0, 4, 8))
    assert keys(plan_avoiding(m, 6, {"d7-6"}, set())) == ["s8", "d9-8"]
    assert keys(plan_avoiding(m, 8, {"d9-8"}, set())) == ["d9-8"]  # the store may be repaired
    with pytest.raises(NoPlanError):
        plan_avoiding(m, 8, {"d9-8"}, {"d9-8"})  # broken: never again


def test_an_unreachable_latest_version_plans_the_newest_reachable_one() -> None:
    """Version 3 is a snapshot alone, set aside (missing): a subscriber at 1 still takes
    version 2's delta, and one without weights the chain to 2; at 2, it tries version 3
    again."""
    m = Manifest((snap(0), delta(1), delta(2), snap(3)))
    plan = plan_avoiding(m, 1, {"s3"}, set())
    assert keys(plan) == ["d2-1"] and plan.target == 2
    assert keys(plan_avoiding(m, None, {"s3"}, set())) == ["s0", "d1-0", "d2-1"]
    assert keys(plan_avoiding(m, 2, {"s3"}, set())) == ["s3"]
    with pytest.raises(NoPlanError, match="version 3"):
        plan_avoiding(m, 2, {"s3"}, {"s3"})
    m = log(10, anchors=(0, 4, 8))
    assert keys(plan_avoiding(m, 6, {"d9-8"}, {"d9-8"})) == ["d7-6", "d8-7"]


def test_unreachable_version_raises() -> None:
    kept, _ = plan_retention(log(10, anchors=(0, 4, 8)), keep_anchors=1)
    with pytest.raises(NoPlanError, match="version 3"):
        plan_catchup(kept, None, target=3)


def test_retention_keeps_the_newest_anchors_and_what_follows() -> None:
    m = log(10, anchors=(0, 4, 8))
    kept, dropped = plan_retention(m, keep_anchors=2)
    assert min(e.version for e in kept.entries) == 4 and kept.anchors[0].version == 4
    assert {e.key for e in dropped} == {"s0", "d1-0", "d2-1", "d3-2"}
    assert kept.retention == Retention(keep_anchors=2, removed_through=3)
    assert plan_retention(kept, keep_anchors=2)[0].retention.removed_through == 3
    for keep in (0, 3):
        same, none = plan_retention(m, keep_anchors=keep)
        assert same.entries == m.entries and none == []
        assert same.retention == Retention(keep_anchors=keep, removed_through=None)


def test_retention_deletes_side_files_no_kept_anchor_lists() -> None:
    shared, old = side_file("config.json", b"{}"), side_file("tokenizer.json", b"old")
    m = log(10, anchors=(0, 4, 8))
    entries = tuple(
        replace(e, files=(shared, old) if e.version == 0 else (shared,)) if e.kind == "snapshot" else e
        for e in m.entries
    )
    kept, dropped = plan_retention(replace(m, entries=entries), keep_anchors=2)
    assert unreferenced_keys(kept, dropped) == [e.key for e in dropped] + [old.key]


def test_anchor_cadence() -> None:
    assert needs_anchor(None, 0, 4)
    assert not needs_anchor(4, 7, 4) and needs_anchor(4, 8, 4)
