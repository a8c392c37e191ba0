"""Fetch objects and check them against the manifest before anything decodes them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch

from weight_teleport.codec import apply_delta, decode_snapshot, pinned_pack
from weight_teleport.errors import PackFormatError
from weight_teleport.format import read_header
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.manifest import Entry, Manifest
from weight_teleport.pipeline.plan import plan_catchup
from weight_teleport.store import Store, TooLarge

Progress = Callable[[int], None]


def fetch(store: Store, entry: Entry, pinned: bool = False) -> bytes | np.ndarray:
    """The object of `entry`, checked: its size, SHA-256 and pack header (kind, version,
    base) must match the entry, else ObjectRejected (truncated, corrupted, misplaced).
    `pinned`: returned in pinned host memory (`pinned_pack`), for staging onto CUDA weights,
    or as it came where no page-locked memory can be had (the stage copies from there)."""
    try:
        data = store.get(entry.key, max_bytes=entry.size)  # never read past the entry's size
    except TooLarge as exc:
        raise ObjectRejected(f"{entry.key}: {exc} (the manifest says {entry.size})") from None
    if len(data) != entry.size:
        raise ObjectRejected(f"{entry.key}: {len(data)} bytes, the manifest says {entry.size} "
                             "(truncated or overwritten)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ObjectRejected(f"{entry.key}: SHA-256 {digest[:16]}..., the manifest says "
                             f"{entry.sha256[:16]}... (corrupted)")
    try:
        header = read_header(data)
    except PackFormatError as exc:
        raise ObjectRejected(f"{entry.key}: not a readable pack ({exc})") from None
    if (header.kind, header.version, header.base_version) != (entry.kind, entry.version, entry.base):
        raise ObjectRejected(
            f"{entry.key}: holds a {header.kind} to version {header.version} from "
            f"{header.base_version}, the manifest lists a {entry.kind} to {entry.version} from "
            f"{entry.base} (duplicated or out-of-order object)")
    if not pinned:
        return data
    try:
        return pinned_pack(data)
    except RuntimeError:  # page-locked memory refused (a limit): the stage copies from the bytes
        return data


def fetch_side_files(store: Store, manifest: Manifest, version: int) -> dict[str, bytes]:
    """The side files of the newest anchor at or before `version` that lists any, each
    checked against its record (size, SHA-256), else ObjectRejected."""
    anchors = [e for e in manifest.anchors if e.version <= version and e.files]
    if not anchors:
        return {}
    out = {}
    for f in anchors[-1].files:
        try:
            data = store.get(f.key, max_bytes=f.size)
        except TooLarge as exc:
            raise ObjectRejected(f"side file {f.name} ({f.key}): {exc}") from None
        if len(data) != f.size or hashlib.sha256(data).hexdigest() != f.sha256:
            raise ObjectRejected(f"side file {f.name} ({f.key}): not the bytes the manifest "
                                 f"names ({len(data)} bytes, the manifest says {f.size})")
        out[f.name] = data
    return out


def materialize(store: Store, manifest: Manifest, version: int | None = None,
                progress: Progress | None = None,
                threads: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """Full weights of `version` (default: the latest) decoded from the store's anchor and
    deltas, with every digest checked; returns (state, version)."""
    plan = plan_catchup(manifest, None, version)
    state: dict[str, torch.Tensor] = {}
    for entry in plan.steps:
        pack = fetch(store, entry)
        if progress is not None:
            progress(len(pack))
        if entry.kind == "snapshot":
            state = decode_snapshot(pack, threads=threads)
        else:
            apply_delta(state, pack, base_version=entry.base, threads=threads)
    return state, plan.target
