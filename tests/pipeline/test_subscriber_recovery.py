"""Subscriber recovery with real stores: faults injected into memory://, file:// and the
HTTP origin. Each fault ends in a resync or a typed error the host can see (`health`,
`SubscriberFailed`), never in wrong weights, a spin, or silence; every version a
subscriber reports is compared bit for bit (integer views) with the publisher's.

Backoffs are small and outcomes are awaited with generous timeouts: nothing here depends
on how fast a busy machine is."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from services import free_port
from weight_versions import expected, same_bits
from weight_versions import FAST, memory_url, publish
from weight_teleport.codec import encode_delta, encode_snapshot
from weight_teleport.pipeline import PublisherConfig, RetentionConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.pipeline.health import SubscriberFailed
from weight_teleport.format.manifest import Manifest, from_json, make_entry
from weight_teleport.store import RetryConfig, Store, StoreConfig, open_store
from weight_teleport.targets.torch import TorchTarget

WAIT_S = 30.0
"""The longest any outcome is awaited (a generous bound, not a timing claim)."""


def zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(t) for k, t in expected(0).items()}


def other(version: int) -> dict[str, torch.Tensor]:
    """Weights of another run at `version` (a reset store's): `expected(version)` times 4,
    so that a delta of one run fails to decode on the other's weights (format error)."""
    return {k: (t.double() * 4).to(t.dtype) for k, t in expected(version).items()}


def same_bits_as(live, want) -> bool:
    from helpers import bits

    return all(torch.equal(bits(live[k]), bits(want[k])) for k in want)


def until(condition, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def follow_checked(sub: Subscriber, live, version: int, want=expected) -> list[int]:
    """Apply until the target holds `version`, checking the weights of every version
    reported; the versions applied, in order."""
    applied, deadline = [], time.monotonic() + WAIT_S
    while sub.version != version:
        assert time.monotonic() < deadline, f"stuck at {sub.version}, want {version}"
        if sub.wait(0.2):
            report = sub.apply()
            assert same_bits_as(live, want(report.version)), f"version {report.version} differs"
            applied += report.versions
    return applied


class CountingStore(Store):
    """A store that forwards to `inner` and counts the reads of each key."""

    def __init__(self, inner: Store):
        super().__init__(inner.config)
        self.inner, self.gets, self.manifest_reads = inner, {}, 0

    def _get(self, key):
        self.gets[key] = self.gets.get(key, 0) + 1
        return self.inner.get(key)

    def _get_range(self, key, start, end):
        return self.inner.get_range(key, start, end)

    def _list(self, prefix):
        return self.inner.list(prefix)

    def _put(self, key, data):
        self.inner.put(key, data)

    def _delete(self, key):
        self.inner.delete(key)

    def _put_manifest(self, data):
        self.inner.put_manifest(data)

    def _get_manifest(self):
        self.manifest_reads += 1
        return self.inner.get_manifest()

    def _watch(self, after, deadline):
        return self.inner.watch(after, max(0.0, deadline - time.monotonic()))


def _manifest(url: str) -> Manifest:
    with open_store(url) as store:
        return from_json(store.get_manifest())


def _put_object(
    url: str, manifest: Manifest, kind: str, version: int, base, pack: bytes, replace_version: bool = False
) -> Manifest:
    """Store `pack` and list it in the manifest (in place of the entry of that version and
    kind when `replace_version`); returns the new manifest."""
    entry = make_entry(version, kind, base, pack, 0)
    entries = [e for e in manifest.entries if not (replace_version and (e.version, e.kind) == (version, kind))]
    entries = sorted(entries + [entry], key=lambda e: (e.version, e.kind != "delta"))
    new = Manifest(tuple(entries), manifest.model)
    with open_store(url) as store:
        store.put(entry.key, pack)
        store.put_manifest(new.to_json())
    return new


# Item 1: weights that are not the next delta's base resync from the newest anchor.


def test_wrong_initial_version_resyncs_instead_of_retrying_forever() -> None:
    """The claimed version's delta fails to decode on these weights (a format error, not a
    digest mismatch, comes first): the subscriber must still see a base mismatch."""
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=3)) as pub:
        publish(pub, range(6))
    live = zeros()
    config = replace(FAST, initial_version=3)
    with Subscriber(url, TorchTarget(live), config) as sub:
        applied = follow_checked(sub, live, 5)
        assert sub.stats.resyncs == 1 and applied[0] == 3, applied  # the newest anchor
        assert sub.health.state == "healthy"


def test_scribbled_live_weights_resync(tmp_path: Path) -> None:
    url, live = f"file://{tmp_path}/store", zeros()
    with Publisher(url, PublisherConfig(anchor_every=2)) as pub, Subscriber(url, TorchTarget(live), FAST) as sub:
        publish(pub, range(3))
        follow_checked(sub, live, 2)
        time.sleep(0.5)  # after the check of the applied patch's digests: the next delta finds it
        live["model.embed_tokens.weight"].view(torch.int16)[:100] ^= 0x4000  # the sampler's bug
        publish(pub, [3])
        follow_checked(sub, live, 3)
        assert sub.stats.resyncs == 1


@pytest.mark.parametrize("latest", [5, 2])
def test_store_reset_under_a_subscriber_resyncs(tmp_path: Path, latest: int) -> None:
    """The store is wiped and a new run publishes other weights under the same versions: up
    to later ones, or up to the very version the subscriber holds (the number is the same,
    the manifest's entries are not: the subscriber must not keep the old run's weights)."""
    url, live = f"file://{tmp_path}/store", zeros()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(3))
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        follow_checked(sub, live, 2)
        shutil.rmtree(tmp_path / "store")
        with Publisher(url, PublisherConfig(anchor_every=2)) as pub:
            for v in range(latest + 1):
                pub.publish(other(v), v)
            assert pub.flush(WAIT_S)
        reports, deadline = [], time.monotonic() + WAIT_S
        while not reports or reports[-1].version != latest:
            assert time.monotonic() < deadline, "the subscriber kept the old run's weights"
            if sub.wait(0.2):
                reports.append(sub.apply())
                assert same_bits_as(live, other(reports[-1].version))
        assert reports[0].resynced and sub.stats.resyncs >= 1


# Item 2: the manifest is re-read between steps; bad entries are set aside, resyncs bounded.


def test_delta_of_another_base_is_set_aside_without_cycling(tmp_path: Path) -> None:
    """Version 2's delta was encoded from other weights. The subscriber holds version 1,
    checked: the delta is set aside (no resync, no flipping back to the anchor), health
    says why, and the next anchor is taken as soon as it is published."""
    url, live = f"file://{tmp_path}/store", zeros()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(4))
    manifest = _manifest(url)
    forged = encode_delta(other(1), expected(2), base_version=1, version=2)
    manifest = _put_object(url, manifest, "delta", 2, 1, forged, replace_version=True)
    bad_key = [e.key for e in manifest.entries if e.version == 2][0]
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        assert follow_checked(sub, live, 1) == [0, 1]
        until(lambda: sub.health.state == "failing", "health to say failing")
        time.sleep(0.5)
        assert not sub.ready() and sub.version == 1 and same_bits(live, 1)
        assert sub.stats.resyncs <= 1, f"{sub.stats.resyncs} resyncs: cycling"
        assert bad_key in sub.health.last_error
        _put_object(url, manifest, "snapshot", 4, None, encode_snapshot(expected(4), version=4))
        assert follow_checked(sub, live, 4) == [4]
        assert sub.health.state == "healthy" and sub.stats.resyncs <= 1


def test_pack_raising_an_untyped_error_is_set_aside(monkeypatch) -> None:
    """A pack whose decoding raises an unexpected exception is counted like any failure,
    set aside after `fetch_attempts`, and another plan (a later anchor) is taken."""
    from weight_teleport.subscribe import stager

    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=3)) as pub:
        publish(pub, range(5))
    bad = [e for e in _memory_manifest(url).entries if e.version == 1][0]
    stage = stager.Stager.stage

    def flaky(self, entry, pack, head):
        if entry.key == bad.key:
            raise KeyError("a decoder bug")
        return stage(self, entry, pack, head)

    monkeypatch.setattr(stager.Stager, "stage", flaky)
    live = {k: t.clone() for k, t in expected(0).items()}
    with Subscriber(url, TorchTarget(live), replace(FAST, initial_version=0)) as sub:
        applied = follow_checked(sub, live, 4)
    assert applied[0] == 3, applied


def _memory_manifest(url: str) -> Manifest:
    return from_json(open_store(url).get_manifest())


def test_manifest_is_reread_between_steps() -> None:
    """A subscriber walking a plan of several steps (one version per apply) reads the
    manifest again before each, so that a manifest that changed under it (an entry set
    aside, a rollback, a new anchor) is seen before the next fetch."""
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(6))
    store, live = CountingStore(open_store(url)), zeros()
    with Subscriber(url, TorchTarget(live), FAST, store=store) as sub:
        assert follow_checked(sub, live, 5) == list(range(6))
        assert store.manifest_reads >= 6


# Item 3: a deleted object backs off, and other plans (a newer anchor) are tried.


def test_deleted_object_backs_off_and_takes_a_newer_anchor() -> None:
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=3, retention=RetentionConfig(keep_anchors=0))) as pub:
        publish(pub, range(7))
    manifest = _memory_manifest(url)
    gone = [e for e in manifest.entries if e.version == 2 and e.kind == "delta"][0]
    open_store(url).delete(gone.key)
    store, live = CountingStore(open_store(url)), {k: t.clone() for k, t in expected(1).items()}
    with Subscriber(url, TorchTarget(live), replace(FAST, initial_version=1), store=store) as sub:
        applied = follow_checked(sub, live, 6)
    assert applied[0] in (3, 6), applied
    assert store.gets.get(gone.key, 0) <= FAST.fetch_attempts


def test_deleted_object_without_alternative_backs_off_with_bounded_events() -> None:
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(3))
    gone = [e for e in _memory_manifest(url).entries if e.version == 2][0]
    data = open_store(url).get(gone.key)
    open_store(url).delete(gone.key)
    store, live = CountingStore(open_store(url)), {k: t.clone() for k, t in expected(1).items()}
    with Subscriber(url, TorchTarget(live), replace(FAST, initial_version=1), store=store) as sub:
        until(lambda: sub.health.state == "failing", "health to say failing")
        t0, n0 = time.monotonic(), store.gets.get(gone.key, 0)
        time.sleep(1.0)
        rate = (store.gets.get(gone.key, 0) - n0) / (time.monotonic() - t0)
        # The backoff is at least retry_backoff_max_s (0.1 s) by now: about 10 reads a
        # second; a busy loop makes thousands.
        assert rate < 40, f"{rate:.0f} reads/s of a deleted object: no backoff"
        assert gone.key in sub.health.last_error and sub.version == 1
        report = sub.apply()
        assert report.versions == [] and len(report.events) <= 100
        open_store(url).put(gone.key, data)
        follow_checked(sub, live, 2)
        assert sub.health.state == "healthy"


def test_an_unreachable_latest_version_does_not_stop_the_versions_before_it() -> None:
    """Version 3 is listed as an anchor alone, and its object is missing: the subscriber
    at version 1 applies version 2's delta, says that version 3 cannot be reached, and
    takes version 3 once its object is there."""
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(3))
    pack = encode_snapshot(expected(3), version=3)
    missing = [e for e in _put_object(url, _memory_manifest(url), "snapshot", 3, None, pack).entries if e.version == 3][
        0
    ]
    open_store(url).delete(missing.key)
    live = {k: t.clone() for k, t in expected(1).items()}
    with Subscriber(url, TorchTarget(live), replace(FAST, initial_version=1)) as sub:
        events, deadline = [], time.monotonic() + WAIT_S
        while sub.version != 2:
            assert time.monotonic() < deadline, f"stuck at {sub.version}, want 2"
            if sub.wait(0.2):
                report = sub.apply()
                assert report.versions == [2] and same_bits(live, 2)
                events += report.events
        until(lambda: sub.health.state == "failing", "health to say failing")
        assert missing.key in sub.health.last_error
        events += sub.apply().events
        assert any("version 3 cannot be reached" in e for e in events), events
        open_store(url).put(missing.key, pack)
        assert follow_checked(sub, live, 3) == [3]


# Item 4: incompatible snapshots and unreachable stores fail loudly within a bound.


def test_incompatible_snapshot_raises_after_the_give_up_time() -> None:
    url = memory_url()
    with Publisher(url) as pub:
        pub.publish({k: t.float() for k, t in expected(0).items()}, 0).wait(WAIT_S)
    seen = []
    config = replace(FAST, give_up_after_s=0.5, on_health=seen.append)
    with Subscriber(url, TorchTarget(zeros()), config) as sub:
        with pytest.raises(SubscriberFailed, match="float32") as failed:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                sub.wait(0.2)
        assert failed.value.health.state == "failing"
        assert sub.health.state == "failing" and "float32" in sub.health.last_error
        with pytest.raises(SubscriberFailed):
            sub.apply()
    assert seen[-1].state == "failing" and seen[-1].gave_up


def test_unreachable_origin_raises_and_logs_once(caplog) -> None:
    port = free_port()
    config = replace(FAST, give_up_after_s=1.0, store=StoreConfig(retry=RetryConfig(attempts=1), timeout_s=5))
    caplog.set_level(logging.DEBUG, logger="weight_teleport")
    with Subscriber(f"http://127.0.0.1:{port}", TorchTarget(zeros()), config) as sub:
        with pytest.raises(SubscriberFailed, match="unreachable|refused") as failed:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                sub.wait(0.2)
        assert failed.value.health.consecutive_failures >= 2
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(loud) <= 4, [r.getMessage() for r in loud]


def test_origin_that_comes_back_recovers_the_health(tmp_path: Path) -> None:
    from services import TOKEN
    from weight_teleport.server import OriginServer, ServerConfig

    port = free_port()
    seen, live = [], zeros()
    config = replace(FAST, on_health=seen.append, store=StoreConfig(retry=RetryConfig(attempts=1), timeout_s=5))
    with Subscriber(f"http://127.0.0.1:{port}", TorchTarget(live), config) as sub:
        until(lambda: sub.health.state == "failing", "health to say failing")
        server_config = ServerConfig(root=tmp_path / "origin", port=port, token=TOKEN)
        with (
            OriginServer(server_config),
            Publisher(f"http://127.0.0.1:{port}", PublisherConfig(store=StoreConfig(token=TOKEN))) as pub,
        ):
            publish(pub, range(2))
            follow_checked(sub, live, 1)
            until(lambda: sub.health.state == "healthy", "health to recover")
            states = [h.state for h in seen]
    assert "failing" in states and states[-1] == "healthy"


# Item 12: a manifest rolled back is refused, unless the subscriber follows resets.


def _store_with_old_manifest(tmp_path: Path) -> tuple[str, bytes]:
    """A file:// store at version 3, and its manifest as it was at version 1."""
    url = f"file://{tmp_path}/store"
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(2))
        old = open_store(url).get_manifest()
        publish(pub, range(2, 4))
    return url, old


def test_rolled_back_manifest_is_refused(tmp_path: Path) -> None:
    url, old = _store_with_old_manifest(tmp_path)
    live = zeros()
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        follow_checked(sub, live, 3)
        open_store(url).put_manifest(old)
        until(lambda: sub.health.state == "failing", "health to say failing")
        assert "older" in sub.health.last_error and "follow_resets" in sub.health.last_error
        time.sleep(0.3)
        assert not sub.ready() and sub.version == 3 and same_bits(live, 3)
        with Publisher(url, PublisherConfig(resume=False, anchor_every=100)) as pub:
            publish(pub, [4])  # a publisher that writes a manifest at version 4 again
        follow_checked(sub, live, 4)
        assert sub.health.state == "healthy"


def test_rollback_is_followed_when_told_to(tmp_path: Path) -> None:
    url, old = _store_with_old_manifest(tmp_path)
    live = zeros()
    with Subscriber(url, TorchTarget(live), replace(FAST, follow_resets=True)) as sub:
        follow_checked(sub, live, 3)
        open_store(url).put_manifest(old)
        assert follow_checked(sub, live, 1) == [0, 1]
