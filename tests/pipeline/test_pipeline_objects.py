"""A follower's failures per object: counted per key, set aside at `attempts` (a failed
fetch is a strike), broken for good after a failed stage, forgiven once staged, forgotten
when the manifest drops them; each one reported, a broken one as permanent."""

import uuid

from weight_teleport.observe.subscriber import SubscriberMetrics, Where
from weight_teleport.subscribe.failures import Failures
from weight_teleport.pipeline.health import HealthMonitor
from weight_teleport.format.manifest import Entry
from weight_teleport.pipeline.metrics import SubscriberStats
from weight_teleport.subscribe.objects import Objects
from weight_teleport.store import open_store


def _objects(attempts: int = 2) -> tuple[Objects, Failures, list]:
    reported = []
    failures = Failures(attempts, lambda why, permanent: reported.append((why, permanent)))
    store = open_store(f"memory://objects-{uuid.uuid4().hex}")
    monitor = HealthMonitor(attempts, None)
    metrics = SubscriberMetrics(None, lambda: Where(None, None, None, monitor.health))
    return Objects(store, False, failures, SubscriberStats(), metrics), failures, reported


def _entry(key: str, version: int = 1) -> Entry:
    return Entry(version=version, kind="delta", base=version - 1, key=key, size=10, sha256="0" * 64)


def test_missing_object_is_struck_then_set_aside():
    (objects, failures, reported), entry = _objects(attempts=2), _entry("packs/1/a.pack")
    try:
        assert objects.fetch(entry) is None  # not in the store
        assert failures.strikes == {entry.key: 1} and failures.set_aside() == set()
        assert objects.fetch(entry) is None
        assert failures.set_aside() == {entry.key} and failures.broken == {}
        assert "failed 2 times" in failures.note()
        assert [permanent for _, permanent in reported] == [False, False]
        assert "set aside" in reported[-1][0] and "set aside" not in reported[0][0]
        failures.staged(entry)
        assert failures.strikes == {} and failures.note() == ""
    finally:
        objects.close()


def test_stage_failures_break_a_key_for_good_until_unlisted():
    (objects, failures, reported), a, b = _objects(attempts=1), _entry("packs/1/a.pack"), _entry("packs/2/b.pack", 2)
    try:
        failures.strike(a, "staging raised", staging=True)
        failures.set_broken(b, "does not fit")
        assert failures.broken == {a.key: "staging raised", b.key: "does not fit"}
        assert "does not fit" in failures.note()
        assert reported[-1] == ("does not fit", True)
        failures.keep_listed({b.key})
        assert failures.broken == {b.key: "does not fit"} and failures.strikes == {}
        failures.forget()
        assert failures.broken == {} and failures.set_aside() == set()
    finally:
        objects.close()
