"""The publisher's worker step: encode one version, upload it, update the manifest."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from weight_teleport.codec import encode_delta, encode_snapshot
from weight_teleport.observe.logs import kv
from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.pipeline.errors import NoPlanError, ObjectRejected
from weight_teleport.pipeline.fetch import materialize
from weight_teleport.publish.anchors import AnchorUploader
from weight_teleport.format.manifest import Entry, Manifest, checked, entry_order, from_json, make_entry, side_file
from weight_teleport.pipeline.metrics import PublishResult
from weight_teleport.pipeline.plan import needs_anchor, plan_retention, unreferenced_keys
from weight_teleport.format.signing import ManifestSigner, signer
from weight_teleport.publish.snapshots import State, state_nbytes
from weight_teleport.store import NotFound, Store, manifest_etag

log = logging.getLogger(__name__)


@dataclass
class EncodeJob:
    version: int
    snapshot: State
    result: PublishResult
    t_publish: float
    """perf_counter() when `publish` was called."""
    files: dict[str, bytes] | None = None
    """Side files given with this version (None: those given last)."""

    def published_at_ms(self) -> int:
        """The wall-clock time of the `publish` call, in Unix milliseconds."""
        return int((time.time() - (time.perf_counter() - self.t_publish)) * 1000)


def _layout(state: State) -> dict:
    return {k: (tuple(t.shape), t.dtype) for k, t in state.items()}


def _side_stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class Encoder:
    """Holds the manifest and the baseline; turns jobs into stored objects."""

    def __init__(self, store: Store, config: PublisherConfig, sign: ManifestSigner | None = None):
        self.store, self.config = store, config
        raw = store.get_manifest()
        self.sign = sign or signer(config.signing_key)
        """The manifest's signer (None: unsigned): `check_config`'s, where the caller has it."""
        sign = self.sign  # a signing publisher builds on signed history only
        self.manifest = (
            from_json(raw, verify=sign.verifier() if sign is not None else None)
            if raw is not None and config.resume
            else Manifest()
        )
        self.manifest_etag = None if raw is None else manifest_etag(raw)
        """The ETag of the store's manifest as last read or written: the next write is
        conditional on it (ManifestChanged if another writer came between)."""
        self.baseline: State | None = None
        self.baseline_version: int | None = None
        self.stream = torch.cuda.Stream() if config.baseline_device == "cuda" else None
        """The CUDA stream the encoder's kernels run on, off the training stream."""
        anchors = self.manifest.anchors
        self.last_anchor: int | None = anchors[-1].version if anchors else None
        """The version of the newest anchor stored or on its way."""
        self._manifest_lock = threading.Lock()
        self.anchors = AnchorUploader(store, self.announce)
        self.catchups = AnchorUploader(store, self.announce, self.anchors.deltas_first, what="catchup")
        self.boot: State | None = None
        """The boot version's weights (`PublisherConfig.catchup_every`), on the baseline
        device; None: no catch-up deltas (off, not yet known, or no longer possible)."""
        catchups = self.manifest.catchup_deltas()
        self.last_catchup: int | None = catchups[-1].version if catchups else self.manifest.boot
        """The newest version with a catch-up delta stored or on its way (at first, the
        boot version)."""
        self.files: dict[str, bytes] = {}
        """The side files every snapshot carries (the latest a `publish` gave)."""
        self._stored_files = {f.key for e in self.manifest.entries for f in e.files}
        self.on_announce: Callable[[Entry], None] | None = None
        """Told of every object announced in the manifest (the publisher's metrics)."""

    def next_version(self) -> int:
        """The first version this publisher may use."""
        latest = self.manifest.latest if self.config.resume else None
        return 0 if latest is None else latest + 1

    def swap_baseline(self, snapshot: State) -> State | None:
        """Make `snapshot` the baseline; return the previous baseline's buffers."""
        old, self.baseline = self.baseline, snapshot
        return old

    def _resume(self) -> None:
        """Fetch the store's latest weights as the baseline (a resumed publisher). Where an
        object on the way is damaged or missing, there is no baseline: the version is
        published as an anchor, which subscribers and later deltas start from."""
        if self.baseline is not None or self.manifest.latest is None:
            return
        try:
            baseline, self.baseline_version = materialize(self.store, self.manifest, threads=self.config.threads)
        except (ObjectRejected, NotFound) as exc:
            log.warning(
                "%s",
                kv(
                    "baseline_unreadable",
                    latest=self.manifest.latest,
                    error=f"{type(exc).__name__}: {exc}",
                    next="this version is published as an anchor",
                ),
            )
            return
        self.baseline = {k: t.to(self.config.baseline_device) for k, t in baseline.items()}

    def _resume_boot(self) -> None:
        """Fetch the boot version's weights (a resumed publisher making catch-up deltas);
        where they cannot be read, catch-up deltas stop, and retention no longer keeps the
        boot version."""
        boot = self.manifest.boot
        if self.boot is not None or not self.config.catchup_every or boot is None:
            return
        try:
            state, _ = materialize(self.store, self.manifest, boot, threads=self.config.threads)
        except (ObjectRejected, NotFound, NoPlanError) as exc:
            log.warning(
                "%s",
                kv("boot_unreadable", boot=boot, error=f"{type(exc).__name__}: {exc}", next="no catch-up deltas"),
            )
            self._set_boot(None)
            return
        self.boot = {k: t.to(self.config.baseline_device) for k, t in state.items()}

    def _set_boot(self, version: int | None) -> None:
        """Name `version` as the manifest's boot version (None: none) from the next write on
        (under the lock the anchor and catch-up threads announce with)."""
        with self._manifest_lock:
            self.manifest = replace(self.manifest, boot=version)

    def run(self, job: EncodeJob) -> PublishResult:
        """Encode, upload and announce `job`'s version; returns its measurements. A delta is
        announced as soon as it is stored; an anchor due with it is encoded next and
        uploaded and announced by the anchor thread (`AnchorUploader`)."""
        r, t0 = job.result, time.perf_counter()
        r.queued_s = t0 - job.t_publish - r.snapshot_s
        self._resume()
        self._resume_boot()
        base = self.baseline_version
        if base is not None:
            assert self.baseline is not None  # a baseline version comes with its baseline
            if _layout(self.baseline) != _layout(job.snapshot):
                log.warning(
                    "version %d changes tensor names, shapes or dtypes: publishing an "
                    "anchor only; followers restart from it",
                    job.version,
                )
                base = None
        with _side_stream(self.stream):
            kind, pack = (
                ("delta", self._encode_delta(self.baseline, job, base))
                if base is not None and self.baseline is not None
                else ("snapshot", self._encode_snapshot(job))
            )
        t1 = time.perf_counter()
        if kind == "snapshot":
            self._keep_boot(job)
        entry = self._stamped(make_entry(job.version, kind, base, pack, state_nbytes(job.snapshot)), job)
        with self.anchors.deltas_first.uploading():
            self.store.put(entry.key, pack, content_hash=entry.sha256)
            self.announce(entry)
        t2 = time.perf_counter()
        if kind == "snapshot":
            self.last_anchor = job.version
        self.baseline_version = job.version
        r.base_version, r.objects, r.raw_bytes = base, [entry], state_nbytes(job.snapshot)
        r.encode_s, r.upload_s, r.total_s = t1 - t0, t2 - t1, t2 - job.t_publish
        if kind == "delta" and needs_anchor(self.last_anchor, job.version, self.config.anchor_every):
            self._start_anchor(job)
        if kind == "delta" and base != self.manifest.boot:
            self._start_catchup(job)
        return r

    def _keep_boot(self, job: EncodeJob) -> None:
        """At a version published as a snapshot: the first version of a fresh store becomes
        the boot version (a copy of its weights is kept); a later one whose tensors differ
        from the boot version's ends catch-up deltas."""
        if not self.config.catchup_every:
            return
        if self.manifest.latest is None:
            with _side_stream(self.stream):
                self.boot = {k: t.clone() for k, t in job.snapshot.items()}
            if self.stream is not None:
                self.stream.synchronize()  # before the snapshot's buffers are recycled
            self._set_boot(job.version)
            self.last_catchup = job.version
        elif self.boot is not None and _layout(self.boot) != _layout(job.snapshot):
            log.warning(
                "%s", kv("catchup_ended", version=job.version, why="the tensors differ from the boot version's")
            )
            self.boot = None
            self._set_boot(None)

    def _start_catchup(self, job: EncodeJob) -> None:
        """Encode the delta from the boot version to `job`'s version, where one is due, and
        hand it to the catch-up thread; postponed to a later version while another uploads."""
        boot, last = self.manifest.boot, self.last_catchup
        if self.boot is None or boot is None or last is None or job.version - last < self.config.catchup_every:
            return
        if self.catchups.busy:
            log.info("%s", kv("catchup_postponed", version=job.version, why="the previous one is still uploading"))
            return
        t0 = time.perf_counter()
        with _side_stream(self.stream):
            pack = self._encode_delta(self.boot, job, boot)
        job.result.catchup_encode_s = time.perf_counter() - t0
        entry = make_entry(job.version, "delta", boot, pack, state_nbytes(job.snapshot))
        entry = self._stamped(replace(entry, catchup=True), job)
        if self.catchups.submit(entry, pack, job.result):
            self.last_catchup = job.version

    def _start_anchor(self, job: EncodeJob) -> None:
        """Encode the anchor of `job`'s version (while the snapshot is still held) and hand
        it to the anchor thread; postponed to a later version while another uploads."""
        if self.anchors.busy:
            log.info("%s", kv("anchor_postponed", version=job.version, why="the previous anchor is still uploading"))
            return
        t0 = time.perf_counter()
        with _side_stream(self.stream):
            pack = self._encode_snapshot(job)
        job.result.anchor_encode_s = time.perf_counter() - t0
        entry = self._stamped(make_entry(job.version, "snapshot", None, pack, state_nbytes(job.snapshot)), job)
        if self.anchors.submit(entry, pack, job.result):
            self.last_anchor = job.version

    def _stamped(self, entry: Entry, job: EncodeJob) -> Entry:
        """`entry` with its publication time and, for a snapshot, the side files (stored
        now, where the store does not hold them yet)."""
        if job.files is not None:
            self.files = dict(job.files)
        entry = replace(entry, published_at_ms=job.published_at_ms())
        if entry.kind != "snapshot" or not self.files:
            return entry
        records = []
        for name, data in sorted(self.files.items()):
            record = side_file(name, data)
            if record.key not in self._stored_files:
                self.store.put(record.key, data)
                self._stored_files.add(record.key)
            records.append(record)
        return replace(entry, files=tuple(records))

    def _options(self) -> dict:
        # a CUDA baseline's packs are copied from the device into pinned memory directly,
        # with no copy into a fresh `bytes` after (for an anchor, the whole model's size)
        opts: dict[str, Any] = {
            "level": self.config.level,
            "threads": self.config.threads,
            "pinned": self.config.baseline_device == "cuda",
        }
        if self.config.chunk_elems is not None:
            opts["chunk_elems"] = self.config.chunk_elems
        if self.config.hints:
            opts["hints"] = self.config.hints
        return opts

    def _encode_delta(self, old: State, job: EncodeJob, base: int):
        return encode_delta(
            old,
            job.snapshot,
            base_version=base,
            version=job.version,
            codec=self.config.codec,
            **self._options(),
        )

    def _encode_snapshot(self, job: EncodeJob):
        return encode_snapshot(job.snapshot, version=job.version, **self._options())

    def announce(self, entry: Entry) -> None:
        """Write the manifest with `entry` in its place (an anchor may follow deltas of later
        versions), then delete what retention dropped from it. One writer at a time: the
        worker and the anchor thread both announce."""
        with self._manifest_lock:
            entries = sorted(self.manifest.entries + (entry,), key=entry_order)
            manifest = replace(self.manifest, entries=tuple(entries))
            manifest, dropped = plan_retention(manifest, self.config.retention.keep_anchors)
            manifest = checked(manifest)
            data = manifest.to_json(sign=self.sign)
            self.store.put_manifest(data, if_match=self.manifest_etag)
            self.manifest, self.manifest_etag = manifest, manifest_etag(data)
        if self.on_announce is not None:
            self.on_announce(entry)
        for key in unreferenced_keys(manifest, dropped):
            try:
                self.store.delete(key)
            except NotFound:
                pass
            self._stored_files.discard(key)

    def wait_uploads(self, deadline: float | None = None) -> bool:
        """Block until no anchor or catch-up delta is in flight (until `deadline`, a
        `time.monotonic()` value; None: no limit); False on timeout."""
        for uploads in (self.anchors, self.catchups):
            if not uploads.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                return False
        return True

    def close(self) -> None:
        """Wait for the anchor and the catch-up delta in flight."""
        self.wait_uploads()
