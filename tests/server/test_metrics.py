"""Prometheus metrics of the publisher, the subscriber and the origin, parsed back with
prometheus_client's own parser: the counters move as they should across publishing,
applying, a rejected object and a resync."""

from __future__ import annotations

import http.client
import urllib.request
from dataclasses import replace

import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services import TOKEN, origin  # noqa: F401 (fixture)
from weight_versions import expected, same_bits
from weight_versions import FAST, follow, memory_url
from weight_teleport.observe.config import MetricsConfig
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.publish.snapshots import state_nbytes
from weight_teleport.store import StoreConfig
from weight_teleport.targets.torch import TorchTarget


def samples(text: str) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value of every sample of an exposition text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(t) for k, t in expected(0).items()}


def test_counters_across_publish_apply_a_rejected_object_and_a_resync(origin) -> None:  # noqa: F811
    store = StoreConfig(token=TOKEN)
    with Publisher(origin.url, PublisherConfig(anchor_every=2, store=store)) as pub:
        for v in range(3):
            pub.publish(expected(v))
        pub.flush()
        anchor = next(e for e in pub.results[2].objects if e.kind == "snapshot")
        path = origin.config.root / "objects" / anchor.key
        path.write_bytes(b"\0" * anchor.size)  # corrupted in place: same size, other bytes
        live = zeros()
        with Subscriber(origin.url, TorchTarget(live), FAST) as sub:
            follow(sub, 2)  # the bad anchor is set aside; version 0 and deltas are taken
            live["model.norm.weight"].view(torch.int32)[0] ^= 1  # the sampler scribbles
            pub.publish(expected(3))
            pub.flush()
            reports = follow(sub, 3)
            assert any(r.resynced for r in reports) and same_bits(live, 3)
            found = samples(sub.metrics.text())
            stats = sub.stats
        pub_found = samples(pub.metrics.text())
    sub_ = "weight_teleport_subscriber_"
    assert value(found, sub_ + "objects_rejected_total") == stats.objects_rejected >= 1
    assert value(found, sub_ + "resyncs_total") == stats.resyncs >= 1
    assert value(found, sub_ + "objects_fetched_total") == stats.objects_fetched
    assert value(found, sub_ + "fetched_bytes_total") == stats.bytes_fetched
    assert value(found, sub_ + "retries_total") >= 1
    assert value(found, sub_ + "version") == 3 and value(found, sub_ + "versions_behind") == 0
    assert value(found, sub_ + "pause_seconds_count") == value(found, sub_ + "versions_applied_total") >= 2
    assert value(found, sub_ + "health", **{sub_ + "health": "healthy"}) == 1
    assert value(found, sub_ + "stage_seconds_count") >= 3

    pub_ = "weight_teleport_publisher_"
    raw = state_nbytes(expected(0))
    assert value(pub_found, pub_ + "versions_published_total") == 4
    assert value(pub_found, pub_ + "failures_total") == 0
    assert value(pub_found, pub_ + "encode_seconds_count") == 4
    assert value(pub_found, pub_ + "raw_bytes_total") == 4 * raw
    assert value(pub_found, pub_ + "wire_bytes_total") == sum(r.wire_bytes for r in pub.results)
    anchors = sum(e.size for r in pub.results for e in r.objects if e.kind == "snapshot")
    assert value(pub_found, pub_ + "stored_bytes_total", kind="snapshot") == anchors
    assert value(pub_found, pub_ + "latest_version") == 3
    assert value(pub_found, pub_ + "queue_depth") == 0

    conn = http.client.HTTPConnection("127.0.0.1", origin.port, timeout=10)
    conn.request("PUT", "/o/refused", b"x", {"Authorization": "Bearer wrong"})
    assert conn.getresponse().status == 403
    with urllib.request.urlopen(origin.url + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        found = samples(resp.read().decode())
    or_ = "weight_teleport_origin_"
    manifests = sum(len(r.objects) for r in pub.results)  # one manifest write per object
    assert value(found, or_ + "requests_total", route="/manifest", method="PUT", status="204") == manifests
    assert value(found, or_ + "uploads_refused_total", status="403") == 1
    assert value(found, or_ + "served_bytes_total", route="/b/{hash}/{key}") >= stats.bytes_fetched
    assert value(found, or_ + "watchers") >= 0


def test_each_instance_has_its_own_registry_or_the_one_given() -> None:
    url, shared = memory_url(), CollectorRegistry()
    with Publisher(url, PublisherConfig(metrics=MetricsConfig(registry=shared))) as pub:
        pub.publish(expected(0)).wait()
        with (
            Subscriber(url, TorchTarget(zeros()), FAST) as a,
            Subscriber(url, TorchTarget(zeros()), FAST) as b,
            Subscriber(url, TorchTarget(zeros()), replace(FAST, metrics=MetricsConfig(port=0))) as served,
        ):
            for sub in (a, b, served):
                follow(sub, 0)
            assert a.metrics.registry is not b.metrics.registry
            with urllib.request.urlopen(served.metrics.url) as resp:
                found = samples(resp.read().decode())
            assert value(found, "weight_teleport_subscriber_version") == 0
    assert shared.get_sample_value("weight_teleport_publisher_versions_published_total") == 1
