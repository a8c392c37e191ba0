"""Fetch objects and check them against the manifest before anything decodes them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec import apply_delta, decode_snapshot, pinned_pack
from weight_teleport.errors import PackFormatError
from weight_teleport.format import PackHeader, read_header
from weight_teleport.pipeline import assemble
from weight_teleport.pipeline.errors import ManifestError, NoPlanError, ObjectRejected
from weight_teleport.format.manifest import Entry, Manifest
from weight_teleport.format.parts import Part, check_whole
from weight_teleport.pipeline.plan import plan_catchup
from weight_teleport.store import Store, TooLarge
from weight_teleport.store.hashing import object_hash, piece_digest, root_of

Progress = Callable[[int], None]


RANGE_BYTES = 32 << 20
"""Bytes per ranged read of a large object (a multiple of every piece size up to 32 MiB)."""
FETCH_THREADS = 8
"""Ranged reads of one object in flight at once."""
PINNED_MAX_BYTES = 2 << 30
"""The largest object fetched into pinned memory. torch's pinned allocator rounds a request
up to a power of two and pins it page by page, seconds for a multi-GB anchor fetched once;
the stage copies a larger object to the device from pageable memory instead, which costs
less than pinning it."""


@dataclass(frozen=True)
class Fetched:
    """An object fetched and checked against its entry, with its pack header: parsed once,
    when it was checked, and passed on to the stage (`stage_delta(header=...)`)."""

    data: bytes | np.ndarray
    header: PackHeader


def fetch(store: Store, entry: Entry, pinned: bool = False) -> bytes | np.ndarray:
    """The bytes of `fetch_pack`."""
    return fetch_pack(store, entry, pinned).data


def fetch_pack(store: Store, entry: Entry, pinned: bool = False) -> Fetched:
    """The object of `entry`, checked: its size, content hash and pack header (kind,
    version, base) must match the entry, else ObjectRejected (truncated, corrupted,
    misplaced). `pinned`: returned in pinned host memory, for staging onto CUDA weights,
    where it has at most PINNED_MAX_BYTES and page-locked memory can be had; else in
    pageable memory (the stage copies from there).

    A large object whose entry has a tree hash comes in piece-aligned ranges read by
    several threads at once from stores that serve ranges, each range copied into the
    result and its pieces hashed by the thread that read it."""
    pinned = pinned and entry.size <= PINNED_MAX_BYTES
    data: bytes | np.ndarray
    if entry.piece_bytes and entry.size > RANGE_BYTES and store.parallel_ranges:
        data = _fetch_ranges(store, entry, pinned)
    else:
        data = _fetch_whole(store, entry)
    header = _check_header(entry, data)
    if pinned and not isinstance(data, np.ndarray):
        data = _pinned(data)
    return Fetched(data, header)


def _fetch_whole(store: Store, entry: Entry) -> bytes:
    try:
        data = store.get(entry.key, max_bytes=entry.size)  # never read past the entry's size
    except TooLarge as exc:
        raise ObjectRejected(f"{entry.key}: {exc} (the manifest says {entry.size})") from None
    if len(data) != entry.size:
        raise ObjectRejected(
            f"{entry.key}: {len(data)} bytes, the manifest says {entry.size} (truncated or overwritten)"
        )
    _check_hash(entry, object_hash(data, entry.piece_bytes))
    return data


def _fetch_ranges(store: Store, entry: Entry, pinned: bool) -> np.ndarray:
    """The object read in ranges in parallel into one buffer, checked. Its last byte is read
    first: an object shorter than its entry says is refused before the buffer of the
    entry's size is allocated."""
    span = max(entry.piece_bytes, RANGE_BYTES - RANGE_BYTES % entry.piece_bytes)
    starts = range(0, entry.size, span)
    _check_range(entry, entry.size - 1, entry.size, len(store.get_range(entry.key, entry.size - 1, entry.size)))
    out = _buffer(entry.size, pinned)

    def place(start: int) -> list[bytes]:
        stop = min(start + span, entry.size)
        _check_range(entry, start, stop, store.get_range_into(entry.key, start, out[start:stop]))
        view = memoryview(out)[start:stop]  # type: ignore[arg-type]  # an ndarray is a buffer; its stubs say so from 3.12 only
        return [piece_digest(view[at : at + entry.piece_bytes]) for at in range(0, len(view), entry.piece_bytes)]

    with ThreadPoolExecutor(min(FETCH_THREADS, len(starts)), thread_name_prefix="wt-fetch") as pool:
        digests = [d for part in pool.map(place, starts) for d in part]
    _check_hash(entry, root_of(digests))
    return out


def _check_range(entry: Entry, start: int, stop: int, came: int) -> None:
    if came != stop - start:
        raise ObjectRejected(
            f"{entry.key}: bytes [{start}, {stop}) came back as {came} bytes; "
            f"the manifest says the object has {entry.size} (truncated or "
            "overwritten)"
        )


def _check_hash(entry: Entry, digest: str) -> None:
    if digest != entry.sha256:
        raise ObjectRejected(
            f"{entry.key}: content hash {digest[:16]}..., the manifest says {entry.sha256[:16]}... (corrupted)"
        )


def _check_header(entry: Entry, data) -> PackHeader:
    try:
        header = read_header(data)
    except PackFormatError as exc:
        raise ObjectRejected(f"{entry.key}: not a readable pack ({exc})") from None
    if (header.kind, header.version, header.base_version) != (entry.kind, entry.version, entry.base):
        raise ObjectRejected(
            f"{entry.key}: holds a {header.kind} to version {header.version} from "
            f"{header.base_version}, the manifest lists a {entry.kind} to {entry.version} from "
            f"{entry.base} (duplicated or out-of-order object)"
        )
    return header


def _buffer(size: int, pinned: bool) -> np.ndarray:
    """`size` bytes to fetch into: pinned host memory where asked and available."""
    if pinned:
        try:
            return torch.empty(size, dtype=torch.uint8, pin_memory=True).numpy()
        except RuntimeError:  # page-locked memory refused (a limit)
            pass
    return np.empty(size, np.uint8)


def _pinned(data: bytes) -> bytes | np.ndarray:
    try:
        return pinned_pack(data)
    except RuntimeError:  # page-locked memory refused (a limit): the stage copies from the bytes
        return data


def side_file_records(manifest: Manifest, version: int) -> tuple:
    """The side files (`SideFile` records) of the newest anchor at or before `version`
    that lists any: those that go with `version`."""
    anchors = [e for e in manifest.anchors if e.version <= version and e.files]
    return anchors[-1].files if anchors else ()


def fetch_side_files(store: Store, manifest: Manifest, version: int) -> dict[str, bytes]:
    """The side files that go with `version` (`side_file_records`), each checked against
    its record (size, SHA-256), else ObjectRejected."""
    out = {}
    for f in side_file_records(manifest, version):
        try:
            data = store.get(f.key, max_bytes=f.size)
        except TooLarge as exc:
            raise ObjectRejected(f"side file {f.name} ({f.key}): {exc}") from None
        if len(data) != f.size or hashlib.sha256(data).hexdigest() != f.sha256:
            raise ObjectRejected(
                f"side file {f.name} ({f.key}): not the bytes the manifest "
                f"names ({len(data)} bytes, the manifest says {f.size})"
            )
        out[f.name] = data
    return out


def materialize(
    store: Store,
    manifest: Manifest,
    version: int | None = None,
    progress: Progress | None = None,
    threads: int | None = None,
    start: tuple[dict[str, torch.Tensor], int] | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """Full weights of `version` (default: the latest) decoded from the store's anchor and
    deltas, with every digest checked; returns (state, version). `start`: weights the caller
    holds and their version (patched in place), planned from as a subscriber does (its deltas,
    a catch-up delta from the boot version, or an anchor: the fewest bytes); a delta whose
    base digests they do not match raises PackMismatchError before anything is written.
    NoPlanError where the manifest lists no version."""
    plan = plan_catchup(manifest, None if start is None else start[1], version)
    if plan.target is None:
        raise NoPlanError("the manifest lists no version: nothing to materialize")
    state: dict[str, torch.Tensor] = {} if start is None else start[0]
    for entry in plan.steps:
        if entry.parts:
            state = _apply_parts(store, entry, state, progress, threads)
            continue
        pack = fetch(store, entry)
        if progress is not None:
            progress(len(pack))
        if entry.kind == "snapshot":
            state = decode_snapshot(pack, threads=threads)
        else:
            apply_delta(state, pack, base_version=entry.base, threads=threads)
    return state, plan.target


def part_entry(entry: Entry, part: Part) -> Entry:
    """The entry one part's pack is fetched and checked as (the version's kind, version, base)."""
    return Entry(entry.version, entry.kind, entry.base, part.key, part.size, part.sha256, 0, part.piece_bytes)


def fetch_parts(store: Store, entry: Entry, pinned: bool = False) -> list[Fetched]:
    """Every part's pack of `entry` (a `fetch.Fetched` each), each checked as `fetch` checks
    an object and against its covers (the names and boxes of its records), and all together
    covering each of their tensors whole: else ObjectRejected."""
    packs: list[Fetched] = []
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for part in entry.parts:
        pack = fetch_pack(store, part_entry(entry, part), pinned)
        header = pack.header
        check_covers(header, part)
        for r in header.tensors:
            if shapes.setdefault(r.name, (tuple(r.shape), r.dtype)) != (tuple(r.shape), r.dtype):
                raise ObjectRejected(
                    f"{part.key}: tensor {r.name!r} is {r.shape} {r.dtype} here, {shapes[r.name]} in another part"
                )
        packs.append(pack)
    check_parts_whole(entry, {n: s for n, (s, _) in shapes.items()})
    return packs


def check_covers(header: PackHeader, part: Part) -> None:
    """ObjectRejected unless the records of a part's pack cover what the manifest lists for
    the part (the names and boxes of its records)."""
    found = tuple(
        (r.name, tuple(map(tuple, r.box)) if r.box is not None else tuple((0, d) for d in r.shape))
        for r in header.tensors
    )
    if found != part.covers:
        raise ObjectRejected(
            f"{part.key}: its records cover {found[:3]}..., the manifest lists "
            f"{part.covers[:3]}... (a pack of another part or writer)"
        )


def check_parts_whole(entry: Entry, shapes: dict[str, tuple[int, ...]]) -> None:
    """ObjectRejected unless the parts of `entry` cover each tensor of `shapes` whole, once."""
    try:
        check_whole(entry.parts, shapes, f"version {entry.version}")
    except ManifestError as exc:
        raise ObjectRejected(str(exc)) from None


def _apply_parts(
    store: Store, entry: Entry, state: dict, progress: Progress | None, threads: int | None
) -> dict[str, torch.Tensor]:
    """`state` advanced by a version made of parts (a snapshot's parts build a new state)."""
    packs = fetch_parts(store, entry)
    if progress is not None:
        progress(sum(len(p.data) for p in packs))
    if entry.kind == "snapshot":
        state = assemble.empty_state([p.header for p in packs])
    staged = assemble.stage_parts(
        state, packs, threads=threads, base_version=entry.base if entry.kind == "delta" else None
    )
    assemble.apply_parts(state, staged, threads)
    return state
