"""The subscriber's objects: failures counted per key, set aside at `fetch_attempts`, broken
for good after a failed stage, forgiven once staged, forgotten when the manifest drops them."""

import uuid

from weight_teleport.observe.subscriber import SubscriberMetrics, Where
from weight_teleport.pipeline.config import SubscriberConfig
from weight_teleport.pipeline.handoff import Handoff
from weight_teleport.pipeline.health import HealthMonitor
from weight_teleport.pipeline.manifest import Entry
from weight_teleport.pipeline.metrics import SubscriberStats
from weight_teleport.pipeline.objects import Objects
from weight_teleport.store import open_store


def _objects(attempts: int = 2) -> Objects:
    config = SubscriberConfig(fetch_attempts=attempts)
    store = open_store(f"memory://objects-{uuid.uuid4().hex}")
    handoff = Handoff(None, True, 1 << 20)
    monitor = HealthMonitor(attempts, None)
    metrics = SubscriberMetrics(None, lambda: Where(None, None, None, monitor.health))
    return Objects(config, store, False, handoff, monitor, SubscriberStats(), metrics)


def _entry(key: str, version: int = 1) -> Entry:
    return Entry(version=version, kind="delta", base=version - 1, key=key, size=10, sha256="0" * 64)


def test_missing_object_is_struck_then_set_aside():
    objects, entry = _objects(attempts=2), _entry("packs/1/a.pack")
    try:
        assert objects.fetch(entry) is None  # not in the store
        assert objects.strikes == {entry.key: 1} and objects.set_aside() == set()
        assert objects.fetch(entry) is None
        assert objects.set_aside() == {entry.key} and objects.broken == {}
        assert "failed 2 times" in objects.note()
        objects.staged(entry)
        assert objects.strikes == {} and objects.note() == ""
    finally:
        objects.close()


def test_stage_failures_break_a_key_for_good_until_unlisted():
    objects, a, b = _objects(attempts=1), _entry("packs/1/a.pack"), _entry("packs/2/b.pack", 2)
    try:
        objects.strike(a, "staging raised", staging=True)
        objects.set_broken(b, "does not fit")
        assert objects.broken == {a.key: "staging raised", b.key: "does not fit"}
        assert "does not fit" in objects.note()
        objects.keep_listed({b.key})
        assert objects.broken == {b.key: "does not fit"} and objects.strikes == {}
        objects.forget()
        assert objects.broken == {} and objects.set_aside() == set()
    finally:
        objects.close()
