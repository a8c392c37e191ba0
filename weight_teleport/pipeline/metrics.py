"""What the pipeline measured: one result per published version, one report per apply."""

from __future__ import annotations

from dataclasses import dataclass, field

from weight_teleport.format.manifest import Entry


@dataclass
class PublishResult:
    """The outcome of one `Publisher.publish`."""

    version: int
    base_version: int | None = None
    """The version the delta was taken against (None for a lone snapshot)."""
    skipped: bool = False
    """The snapshot was dropped by back-pressure ("skip") and never published."""
    objects: list[Entry] = field(default_factory=list)
    """The objects written (a delta, and a snapshot at anchors)."""
    raw_bytes: int = 0
    """Bytes of the weights."""
    snapshot_s: float = 0.0
    """Time `publish` spent copying the weights (the only time it blocks training)."""
    queued_s: float = 0.0
    """Time the snapshot waited in the queue."""
    encode_s: float = 0.0
    upload_s: float = 0.0
    """Time to write the objects and the manifest."""
    total_s: float = 0.0
    """From the `publish` call to the manifest naming this version."""
    anchor_encode_s: float = 0.0
    """Time the worker spent encoding this version's anchor, after announcing its delta
    (0 when it carries none)."""
    anchor_s: float = 0.0
    """Time the anchor thread took to store and announce the anchor (0 until it has)."""
    catchup_encode_s: float = 0.0
    """Time the worker spent encoding this version's catch-up delta from the boot version
    (0 when it carries none)."""
    catchup_s: float = 0.0
    """Time the catch-up thread took to store and announce it (0 until it has)."""

    @property
    def wire_bytes(self) -> int:
        """Bytes a follower fetches for this version (the delta, else the snapshot)."""
        deltas = [e.size for e in self.objects if e.kind == "delta" and e.base == self.base_version]
        return deltas[0] if deltas else sum(e.size for e in self.objects if e.kind == "snapshot")

    @property
    def ratio(self) -> float:
        """Weights bytes per wire byte."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else 0.0


@dataclass
class UpdateReport:
    """What one `Subscriber.apply` did."""

    versions: list[int] = field(default_factory=list)
    """Versions applied, in order (empty when nothing was ready)."""
    version: int | None = None
    """The target's version afterwards."""
    bytes_fetched: int = 0
    """Object bytes fetched for the applied versions."""
    pause_s: float = 0.0
    """Time the target's weights were being written."""
    resynced: bool = False
    """A resync from an anchor happened since the previous apply."""
    events: list[str] = field(default_factory=list)
    """Resyncs, rejected objects and other failures since the previous apply, each once
    (at most 100, the oldest dropped); `Subscriber.health` holds the current state."""


@dataclass
class SubscriberStats:
    """Running totals of a subscriber."""

    bytes_fetched: int = 0
    objects_fetched: int = 0
    objects_rejected: int = 0
    resyncs: int = 0
    fetch_s: float = 0.0
    """Time spent fetching and checking objects that were accepted."""
    stage_s: float = 0.0
    """Time spent decoding and verifying (outside the pause)."""
    pause_s: float = 0.0
