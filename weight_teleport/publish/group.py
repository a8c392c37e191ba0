"""Sharded trainers: every rank encodes and uploads its own shard; no rank gathers the
weights. A version is one manifest entry made of the ranks' parts (docs/FORMAT.md,
"Versions made of parts"), written by rank 0 once every rank reported its part stored.

Ranks report through torch.distributed object collectives (`ranks.py`: a gloo group of
their own, CPU tensors of metadata only, ended by `close`). A rank that dies mid-version
makes the others' collective fail: rank 0 writes nothing, so subscribers never see that
version, and a new group (restarted ranks) publishes its first version whole."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from weight_teleport.codec import TensorSlice, encode_delta, encode_snapshot
from weight_teleport.format import read_header
from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.publish.encode import Encoder
from weight_teleport.pipeline.errors import ConfigError, GroupFailed, PublishFailed
from weight_teleport.format.manifest import object_key, parts_entry
from weight_teleport.format.parts import Part
from weight_teleport.pipeline.plan import needs_anchor
from weight_teleport.publish.ranks import Ranks
from weight_teleport.publish.shards import local_shards
from weight_teleport.quantize import sampler_format
from weight_teleport.store import Store, open_store
from weight_teleport.store.hashing import PIECE_BYTES, tree_sha256

log = logging.getLogger(__name__)


@dataclass
class PartResult:
    """What one rank did for one version."""

    version: int
    kinds: list[str] = field(default_factory=list)
    """The entries published: "delta" and/or "snapshot" (empty: the version failed)."""
    part_bytes: dict[str, int] = field(default_factory=dict)
    """kind -> bytes of this rank's part (0: the rank held nothing to publish)."""
    raw_bytes: int = 0
    """Bytes of the weights this rank holds."""
    encode_s: float = 0.0
    upload_s: float = 0.0
    total_s: float = 0.0


class PublisherGroup:
    """One rank's publisher of a group of trainer ranks (every rank of `group`, default
    every rank of the job, makes one and calls `publish` for every version, in step: it is
    a collective). Close it (or use it as a context manager) on every rank before the
    process exits: `close` ends the gloo group it runs its collectives on (`ranks.py`).

    `hints` (name -> walk order and bounds: `codec.Hint`, a pair, or the sampler layouts'
    `slice_hints`) cut every rank's records where sampler ranks' slices begin or end.
    Baselines are each rank's own previous shards, kept where the shards are (a copy)."""

    def __init__(
        self,
        url: str,
        config: PublisherConfig | None = None,
        *,
        group=None,
        store: Store | None = None,
        hints: Mapping | None = None,
    ):
        self.config = config = config or PublisherConfig()
        if config.catchup_every:
            raise ConfigError(
                "PublisherConfig.catchup_every: a PublisherGroup does not make catch-up deltas "
                "(a single Publisher does); use 0"
            )
        self._ranks = Ranks(group)
        self.rank = self._ranks.rank
        self.hints = dict(hints or {})
        self._format = sampler_format(config.sampler_format)
        self._own_store = store is None
        self.store: Store | None = None
        self._encoder: Encoder | None = None
        """Rank 0's: the manifest, its ETag, retention and signing."""
        self.baseline: dict[str, torch.Tensor] | None = None
        self.baseline_version: int | None = None
        self.last_anchor: int | None = None
        try:
            self.store = store or open_store(url, config.store)
            self.store.check_write_access()
            self._encoder = Encoder(self.store, config) if self.rank == 0 else None
            latest = self._encoder.manifest.latest if self._encoder and config.resume else None
            self.next_version = self._ranks.broadcast(0 if latest is None else latest + 1)
        except BaseException:
            self.close()
            raise

    def publish(
        self,
        state: Mapping[str, torch.Tensor],
        version: int | None = None,
        *,
        slices: Mapping[str, TensorSlice] | None = None,
    ) -> PartResult:
        """Publish this rank's shards of `state` as `version` (default: the next one), with
        the other ranks: DTensors give their boxes; plain tensors are the boxes `slices`
        names (else whole tensors this rank alone holds). Returns once the version is in
        the manifest; raises PublishFailed on every rank where any rank failed (the version
        is not published; the next one is encoded against the last published), with a
        GroupFailed cause where a rank died or left: the group is broken, close it."""
        t0 = time.perf_counter()
        version = self.next_version if version is None else int(version)
        tensors, boxes = local_shards(state, slices)
        r = PartResult(version)
        kinds = ["delta"] if self.baseline is not None else ["snapshot"]
        if kinds == ["delta"] and needs_anchor(self.last_anchor, version, self.config.anchor_every):
            kinds.append("snapshot")
        parts, error = {}, None
        try:
            if self._format is None:
                snapshot = {k: t.clone() for k, t in tensors.items()}
            else:  # the sampler's checkpoint of this rank's shards (new tensors: the snapshot)
                snapshot, boxes = self._format.quantize_shards(tensors, boxes)
            r.raw_bytes = sum(t.numel() * t.element_size() for t in snapshot.values())
            for kind in kinds:
                parts[kind] = self._part(kind, version, snapshot, boxes, r)
        except Exception as exc:  # reported to the group: nobody announces the version
            log.error("rank %d: encoding or storing version %d failed: %s", self.rank, version, exc)
            error = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        try:
            outcome = self._commit(version, kinds, parts, error, r)
        except GroupFailed as exc:
            raise PublishFailed([(version, exc)]) from exc
        if outcome is not None:
            raise PublishFailed([(version, RuntimeError(outcome))])
        self.baseline, self.baseline_version, self.next_version = snapshot, version, version + 1
        if "snapshot" in kinds:
            self.last_anchor = version
        r.kinds, r.total_s = kinds, time.perf_counter() - t0
        return r

    def _part(self, kind: str, version: int, snapshot: dict, boxes: dict, r: PartResult) -> Part | None:
        """Encode and store this rank's part of `kind`; None where the rank holds nothing."""
        if not snapshot:
            r.part_bytes[kind] = 0
            return None
        t0 = time.perf_counter()
        opts: dict[str, Any] = {
            "level": self.config.level,
            "threads": self.config.threads,
            "slices": boxes or None,
            "hints": {k: h for k, h in self.hints.items() if k in snapshot} or None,
        }
        if self.config.chunk_elems is not None:
            opts["chunk_elems"] = self.config.chunk_elems
        if kind == "delta":
            # a delta is published only with a baseline (`publish`)
            assert self.baseline is not None and self.baseline_version is not None
            pack = encode_delta(
                self.baseline,
                snapshot,
                base_version=self.baseline_version,
                version=version,
                codec=self.config.codec,
                **opts,
            )
        else:
            pack = encode_snapshot(snapshot, version=version, **opts)
        pack = bytes(pack)
        t1 = time.perf_counter()
        digest = tree_sha256(pack, PIECE_BYTES)
        base = self.baseline_version if kind == "delta" else None
        key = object_key(version, kind, base, pack, digest).replace(".pack", f"-r{self.rank}.pack")
        assert self.store is not None  # opened in __init__
        self.store.put(key, pack, content_hash=digest)
        r.encode_s += t1 - t0
        r.upload_s += time.perf_counter() - t1
        r.part_bytes[kind] = len(pack)
        covers = tuple(
            (rec.name, tuple(map(tuple, rec.box)) if rec.box is not None else tuple((0, d) for d in rec.shape))
            for rec in read_header(pack).tensors
        )
        return Part(key, len(pack), digest, covers, PIECE_BYTES)

    def _commit(self, version: int, kinds: list[str], parts: dict, error: str | None, r: PartResult) -> str | None:
        """Gather every rank's parts; rank 0 announces the version's entries when all are
        stored. Returns None when the version is published, else why not (on every rank)."""
        reports = self._ranks.gather((parts, error, r.raw_bytes))
        errors = [e for _, e, _ in reports if e is not None]
        outcome = "; ".join(errors) if errors else None
        if self.rank == 0 and outcome is None:
            assert self._encoder is not None  # rank 0's
            try:
                raw = sum(b for _, _, b in reports)
                for kind in kinds:
                    found = tuple(p[kind] for p, _, _ in reports if p.get(kind) is not None)
                    base = self.baseline_version if kind == "delta" else None
                    self._encoder.announce(parts_entry(version, kind, base, found, raw))
            except Exception as exc:  # the other ranks learn it below
                outcome = f"rank 0: writing the manifest failed: {type(exc).__name__}: {exc}"
        return self._ranks.broadcast(outcome)

    def close(self) -> None:
        """Close the store (if the publisher opened it) and end the group: its threads
        have ended when this returns."""
        try:
            if self._encoder is not None:
                self._encoder.close()
            if self._own_store and self.store is not None:
                self.store.close()
        finally:
            self._ranks.close()

    def __enter__(self) -> "PublisherGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
