"""The subscriber's background loop: watch, plan, fetch, check, stage; retry on failure."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.pipeline.errors import ManifestError, NoPlanError, ObjectRejected
from weight_teleport.pipeline.fetch import fetch
from weight_teleport.pipeline.manifest import Entry, Manifest, from_json
from weight_teleport.pipeline.plan import Plan, plan_catchup
from weight_teleport.store import NotFound, StoreError, manifest_etag

if TYPE_CHECKING:
    from weight_teleport.pipeline.subscriber import Subscriber

log = logging.getLogger(__name__)


class Follower:
    """State of the background loop: the manifest seen, the staged head, failed keys."""

    def __init__(self, sub: "Subscriber", head: int | None):
        self.sub, self.config = sub, sub.config
        self.head = head
        """The version the next object is staged against (None: no usable weights)."""
        self.manifest: Manifest | None = None
        self.etag: str | None = None
        self.failures: dict[str, int] = {}
        self.resync_reason: str | None = None

    def request_resync(self, reason: str) -> None:
        """Restart from an anchor at the next step (called from other threads)."""
        self.resync_reason = reason

    def run(self) -> None:
        """Follow the store until the subscriber closes."""
        while not self.sub._closed:
            try:
                self.step()
            except StoreError as exc:
                self.sub._event(f"store unavailable ({exc}); retrying")
                time.sleep(self.config.retry_backoff_s)
            except Exception:  # keep following: a sampler must not lose its updates
                log.exception("unexpected error while following the store; retrying")
                time.sleep(self.config.retry_backoff_max_s)

    def step(self) -> None:
        """One turn: stage the next object of the plan, or wait for a new manifest."""
        self.sub._verify_applied()
        if self.resync_reason is not None:
            reason, self.resync_reason = self.resync_reason, None
            self._resync(reason)
        plan = self._plan()
        if plan is None or not plan.steps:
            self._refresh(wait=True)
            return
        if plan.chain_broken:
            self._resync(f"no chain of deltas from version {self.head} to {plan.target} "
                         "(retention removed it)")
        if not self.sub._wait_for_room():
            return
        self.sub._verify_applied()
        if self.resync_reason is not None:
            return  # the live weights lack the last patch's digests: resync at the next step
        entry = plan.steps[0]
        pack = self._fetch(entry)
        if pack is not None:
            self._stage(entry, pack)

    def _plan(self) -> Plan | None:
        if self.manifest is None:
            return None
        avoid = {k for k, n in self.failures.items() if n >= self.config.fetch_attempts}
        try:
            return plan_catchup(self.manifest, self.head, exclude=avoid)
        except NoPlanError:
            pass
        try:
            return plan_catchup(self.manifest, self.head)
        except NoPlanError as exc:
            self.sub._event(str(exc))
            return None

    def _refresh(self, wait: bool) -> None:
        """Read the manifest: at once, or waiting (bounded) for a new one."""
        raw = self.sub._store.watch(self.etag, self.config.watch_timeout_s) if wait \
            else self.sub._store.get_manifest()
        if raw is None:
            return
        self.etag = manifest_etag(raw)
        try:
            self.manifest = from_json(raw)
        except ManifestError as exc:
            self.sub._event(f"ignoring the store's manifest: {exc}")

    def _resync(self, reason: str) -> None:
        self.head = None
        self.sub.stats.resyncs += 1
        self.sub._event(f"resync from the latest anchor: {reason}", resync=True)

    def _fetch(self, entry: Entry) -> bytes | np.ndarray | None:
        """The checked object (in pinned memory for CUDA weights), or None after a rejection
        (logged, retried later)."""
        t0 = time.perf_counter()
        try:
            pack = fetch(self.sub._store, entry, pinned=self.sub._stager.on_cuda)
        except NotFound:
            self.sub._event(f"{entry.key} is gone from the store; rereading the manifest")
            self._refresh(wait=False)
            return None
        except ObjectRejected as exc:
            self._reject(entry, str(exc))
            return None
        self.failures.pop(entry.key, None)
        self.sub.stats.fetch_s += time.perf_counter() - t0
        self.sub.stats.bytes_fetched += len(pack)
        self.sub.stats.objects_fetched += 1
        return pack

    def _reject(self, entry: Entry, why: str) -> None:
        n = self.failures[entry.key] = self.failures.get(entry.key, 0) + 1
        self.sub.stats.objects_rejected += 1
        self.sub._event(f"rejected {why}; attempt {n}, retrying")
        delay = self.config.retry_backoff_s * 2 ** (n - 1)
        time.sleep(min(delay, self.config.retry_backoff_max_s))
        self._refresh(wait=False)

    def _stage(self, entry: Entry, pack: bytes) -> None:
        t0 = time.perf_counter()
        try:
            staged = self.sub._stager.stage(entry, pack, self.head)
        except (PackMismatchError, DigestMismatchError) as exc:
            if entry.kind == "delta":
                self._resync(f"version {entry.version} does not fit the weights: {exc}")
            else:
                self._reject(entry, f"{entry.key}: {exc}")
            return
        except PackFormatError as exc:
            self._reject(entry, f"{entry.key}: {exc}")
            return
        self.sub.stats.stage_s += time.perf_counter() - t0
        self.head = entry.version
        self.sub._push(entry, staged)
