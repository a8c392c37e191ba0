"""The publisher's Prometheus metrics (`Publisher.metrics`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from weight_teleport.observe.config import MetricsConfig
from weight_teleport.observe.prom import NAMESPACE, SECONDS_BUCKETS, Exposed


class PublisherMetrics(Exposed):
    """Counters and timings of one publisher; the publisher calls the verbs."""

    def __init__(self, config: MetricsConfig | None, queue_depth: Callable[[], int]):
        super().__init__(config, "publisher")
        opts: dict[str, Any] = dict(namespace=NAMESPACE, subsystem="publisher", registry=self.registry)
        seconds: dict[str, Any] = dict(buckets=SECONDS_BUCKETS, **opts)
        self.versions = Counter("versions_published", "Versions published (in the manifest).", **opts)
        self.skipped = Counter("versions_skipped", "Snapshots dropped by back-pressure (backpressure='skip').", **opts)
        self.failures = Counter("failures", "Versions that failed to publish.", **opts)
        self.encode = Histogram("encode_seconds", "Time to encode a version's pack.", **seconds)
        self.upload = Histogram("upload_seconds", "Time to store a version's pack and manifest.", **seconds)
        self.total = Histogram(
            "publish_seconds", "From the publish call to the manifest naming the version.", **seconds
        )
        self.snapshot = Histogram(
            "snapshot_seconds", "Time publish blocked the caller (copying the weights).", **seconds
        )
        self.wire = Counter(
            "wire_bytes", "Bytes a follower fetches per version (its delta, else its snapshot), summed.", **opts
        )
        self.raw = Counter("raw_bytes", "Bytes of the weights of each version published, summed.", **opts)
        self.stored = Counter("stored_bytes", "Bytes of the objects announced, by kind.", labelnames=("kind",), **opts)
        self.latest = Gauge("latest_version", "The newest version published.", **opts)
        self.queue = Gauge("queue_depth", "Snapshots waiting to be encoded.", **opts)
        self.queue.set_function(queue_depth)

    def published(self, result) -> None:
        """A version reached the manifest (`PublishResult`)."""
        self.versions.inc()
        self.encode.observe(result.encode_s)
        self.upload.observe(result.upload_s)
        self.total.observe(result.total_s)
        self.snapshot.observe(result.snapshot_s)
        self.wire.inc(result.wire_bytes)
        self.raw.inc(result.raw_bytes)
        self.latest.set(result.version)

    def announced(self, entry) -> None:
        """An object was announced in the manifest (a delta, a snapshot, an anchor)."""
        self.stored.labels(entry.kind).inc(entry.size)
