"""The codec's public functions, over the backend of the tensors' device (the interface
and the one place that picks it: codec/backend.py)."""

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping

import numpy as np
import torch

from weight_teleport.codec import layout, registry
from weight_teleport.codec import walks as W
from weight_teleport.codec.backend import Backend, backend_of
from weight_teleport.codec.slices import chunk_window
from weight_teleport.codec.walks import Hint, TensorSlice
from weight_teleport.codec.dtypes import BY_NAME, dtype_info
from weight_teleport.codec.patch import ApplyReport, StagedParts, StagedPatch
from weight_teleport.codec.plan import DEFAULT_CHUNK_ELEMS, check_chunk_elems
from weight_teleport.errors import PackMismatchError
from weight_teleport.format import PackHeader, PackLimits, TensorRecord, read_header, write_pack, write_pack_into
from weight_teleport.format.container import PackBuffer
from weight_teleport.format.limits import over_limit
from weight_teleport.host_memory import collections_paused

DEFAULT_LEVEL = 3


def _backend(tensors: Iterable[torch.Tensor]) -> Backend:
    """The backend of the tensors' device (`codec.backend.backend_of`; the one name here that
    the CPU-run CUDA tests point at the CUDA backend)."""
    return backend_of(tensors)


def _items(
    new: Mapping[str, torch.Tensor],
    old: Mapping[str, torch.Tensor] | None,
    slices: Mapping[str, TensorSlice] | None = None,
    hints: Mapping[str, Hint] | None = None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
):
    if old is not None:
        if set(old) != set(new):
            diff = sorted(set(old) ^ set(new))[:5]
            raise ValueError(f"old and new states hold different tensor names, e.g. {diff}")
    slices, hints = slices or {}, hints or {}
    unknown = sorted((set(slices) | set(hints)) - set(new))
    if unknown:
        raise ValueError(f"slices or hints name tensors the state does not hold, e.g. {unknown[:5]}")
    backend = _backend([*new.values(), *(old.values() if old is not None else [])])
    items, walks = [], list[tuple[TensorSlice, Hint] | None]()
    for name, t in new.items():
        info = dtype_info(t.dtype)
        if old is not None and (old[name].shape != t.shape or old[name].dtype != t.dtype):
            raise ValueError(
                f"tensor {name!r} changed shape or dtype: {tuple(old[name].shape)} "
                f"{old[name].dtype} -> {tuple(t.shape)} {t.dtype}; publish a snapshot"
            )
        sl = slices.get(name) or TensorSlice(tuple(t.shape), W.whole(t.shape))
        if W.extents(sl.box) != tuple(t.shape):
            raise ValueError(f"tensor {name!r} is {tuple(t.shape)}, its slice's box is {sl.box}")
        hint = None if hints.get(name) is None else W.as_hint(hints[name])
        if name not in slices and hint is None:
            items.append(backend.item(name, info, t, None if old is None else old[name]))
            walks.append(None)
            continue
        hint = hint or W.Hint()
        walk_new = W.whole_walk(t, hint.order)
        walk_old = None if old is None else W.whole_walk(old[name], hint.order)
        items.append(backend.walk_item(name, info, walk_new, walk_old, sl, hint, chunk_elems))
        walks.append((sl, hint))
    return backend, items, walks


def _placed(records, walks) -> None:
    """Records of walks (encoded as flat tensors) put back in checkpoint coordinates."""
    for rec, walk in zip(records, walks):
        if walk is None:
            continue
        sl, order = walk[0], walk[1].order
        rec.shape = sl.shape
        rec.box = None if sl.is_whole else [tuple(b) for b in sl.box]
        rec.order = "cols" if order == "cols" and len(sl.shape) >= 2 else None


def _pack(
    kind,
    backend_items,
    version,
    base_version,
    chunk_elems,
    level,
    threads,
    cuda=None,
    pinned=False,
    codec=registry.DEFAULT,
):
    check_chunk_elems(chunk_elems)
    backend, items, walks = backend_items
    records, chunks, ready, codecs = backend.encode(items, chunk_elems, level, threads, cuda, pinned, codec)
    _placed(records, walks)
    if kind == "delta":
        chunks = _laid_out(records, chunks, walks, chunk_elems)
    header = PackHeader(
        kind=kind,
        version=version,
        base_version=base_version,
        chunk_elems=chunk_elems,
        tensors=records,
        stream_codecs=codecs,
    )
    if pinned:
        from weight_teleport.codec.cuda.runtime.memory import pinned_empty

        return write_pack_into(header, chunks, pinned_empty, ready)  # the header is written during the copy
    ready()
    return write_pack(header, chunks)


def _laid_out(records, chunks: list, walks, chunk_elems: int) -> list:
    """The payload's parts in the reference writer's layout (codec/layout.py): by slice
    where a hint cut records at receivers' slice bounds, else as the backend wrote them."""
    slices = []
    for rec, walk in zip(records, walks):
        cut = None if walk is None or not walk[1].bounds else W.cut_slices(walk[0], walk[1], chunk_elems)
        slices.append(cut if cut is not None and len(cut) == len(rec.chunks) else None)
    if all(s is None for s in slices):
        return chunks
    return layout.slice_major(records, chunks, slices)


@collections_paused()
def encode_delta(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    *,
    base_version: int,
    version: int,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    cuda=None,
    pinned: bool = False,
    slices: Mapping[str, TensorSlice] | None = None,
    hints: Mapping[str, Hint] | None = None,
    codec: str = registry.DEFAULT,
    coder: str | None = None,
) -> bytes | np.ndarray:
    """A pack that turns `old` (at `base_version`) into `new` (at `version`), bit for bit.

    Both states map the same names to tensors of the same shapes and dtypes. `level` is the
    zstd level of the streams (CPU stream coding); `threads` defaults to all cores. `codec`
    is the codec of the sparse records: "sparse" (zstd streams, which every reader stages),
    "sparse_ac" (an adaptive range coder, smaller packs, slower to code where many
    elements change; both backends write and stage it; docs/FORMAT.md), or "auto" (per
    record: `sparse_ac` where at most 1% of its elements changed, else `sparse`; the same
    bytes on both backends, `format.codecs.pick`); unchanged and
    heavily changed tensors get their own codecs. `coder` is its deprecated spelling
    ("zstd": "sparse", "adaptive": "sparse_ac"). `cuda`, a
    `weight_teleport.codec.cuda.config.CudaCodecConfig`, picks the CUDA backend's stream
    codec (default: zstd frames of Huffman-coded literals written on the GPU, portable).

    CUDA states are encoded on the current CUDA stream (call it inside
    `torch.cuda.stream(s)` to keep it off the training stream); the host waits for the
    device only to learn sizes (the key histograms the class plans are made from, the
    symbol streams' total, the chunks' lengths and CRCs) and to copy the finished payload.

    The pack is `bytes`, or with `pinned` a uint8 array in pinned host memory, the form
    `pinned_pack` gives (needs CUDA). The GPU then copies a CUDA state's payload straight into
    it, where a `bytes` pack costs a host copy into fresh memory after that. The memory comes
    from torch's caching allocator: freed, it serves the next pack.

    `slices[name]` says that `new[name]` (and `old[name]`) is a box of a larger checkpoint
    tensor (a trainer rank's shard): its record covers that box (format version 2).
    `hints[name]` walks and cuts a record for receivers holding slices: a `Hint`, a pair
    `(order, bounds)` or any object with those two fields (`targets.vllm_layout.SliceHint`);
    bounds are positions in the walk of the WHOLE tensor, and a record over a box is cut
    where they fall inside it. Records over walks carry a digest per chunk, so that a
    receiver holding a slice verifies the chunks it stages alone."""
    codec = registry.choose(codec, coder, stacklevel=3)  # 3: past `collections_paused`
    items = _items(new, old, slices, hints, chunk_elems)
    return _pack("delta", items, int(version), int(base_version), chunk_elems, level, threads, cuda, pinned, codec)


@collections_paused()
def encode_snapshot(
    state: Mapping[str, torch.Tensor],
    *,
    version: int,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    pinned: bool = False,
    slices: Mapping[str, TensorSlice] | None = None,
    hints: Mapping[str, Hint] | None = None,
) -> bytes | np.ndarray:
    """A pack holding the full weights of `state` (an anchor a receiver can start from);
    `pinned`, `slices` and `hints` as for `encode_delta` (a rank's slice of an anchor)."""
    return _pack(
        "snapshot",
        _items(state, None, slices, hints, chunk_elems),
        int(version),
        None,
        chunk_elems,
        level,
        threads,
        pinned=pinned,
    )


def _lives(
    state: Mapping[str, torch.Tensor], header: PackHeader, strict: bool, held: Mapping[str, TensorSlice] | None = None
):
    """(backend, lives, walks, windows): a live walk view of each record the state holds
    elements of; `walks[name]` = (held box, staged box, order) for records over boxes, and
    `windows[name]` = (walk start, first chunk, stop chunk) where the state holds a part of a
    record (the backends' `stage`)."""
    held = held or {}
    missing = [t.name for t in header.tensors if t.name not in state]
    if missing and not held:
        raise PackMismatchError(f"the state has no tensor {missing[0]!r} ({len(missing)} missing)")
    extra = set(state) - {t.name for t in header.tensors}
    if strict and extra:
        raise PackMismatchError(
            f"the pack does not cover tensor {sorted(extra)[0]!r} of the state "
            f"({len(extra)} more); pass strict=False to leave such tensors alone"
        )
    backend = _backend(state[t.name] for t in header.tensors if t.name in state)
    lives, walks, windows = {}, {}, {}
    for rec in header.tensors:
        if rec.name not in state:
            continue
        t, sl = state[rec.name], held.get(rec.name)
        mine = sl.box if sl is not None else W.whole(rec.shape)
        if (
            (sl is not None and sl.shape != rec.shape)
            or tuple(t.shape) != W.extents(mine)
            or t.dtype != BY_NAME[rec.dtype].torch_dtype
        ):
            raise PackMismatchError(
                f"tensor {rec.name!r} is {tuple(t.shape)} {t.dtype} in the state "
                f"(box {mine}) but {rec.shape} {rec.dtype} in the pack"
            )
        box = tuple(map(tuple, rec.box)) if rec.box is not None else W.whole(rec.shape)
        order = rec.order or "rows"
        sub = W.intersect(box, mine) if W.numel(box) else box
        if sub is None:
            continue
        if sub != box:
            windows[rec.name] = chunk_window(header, rec, mine)
        if rec.box is not None or rec.order is not None or sl is not None:
            walks[rec.name] = (mine, sub, order)
            t = W.walk_view(t, mine, sub, order)
        lives[rec.name] = backend.Live(t, BY_NAME[rec.dtype])
    return backend, lives, walks, windows


def pinned_pack(pack) -> np.ndarray:
    """A copy of `pack` (any bytes-like object) in pinned host memory, as a uint8 array that
    every function here takes as a pack. `stage_delta` onto CUDA weights copies such a pack
    to the device from where it is, where a `bytes` pack is first copied into a pinned buffer
    on host threads. The memory comes from torch's caching allocator: freed, it serves the
    next pack. Needs CUDA."""
    from weight_teleport.codec.cuda.runtime.memory import pinned_copy

    return pinned_copy(pack)


@collections_paused()
def stage_delta(
    state: Mapping[str, torch.Tensor],
    pack: PackBuffer,
    *,
    base_version: int | None = None,
    check_base: bool = True,
    strict: bool = True,
    threads: int | None = None,
    device_budget: int | None = None,
    cuda=None,
    limits: PackLimits | None = None,
    held: Mapping[str, TensorSlice] | None = None,
    header: PackHeader | None = None,
) -> StagedPatch:
    """Decode and verify a pack against `state` without writing anything.

    `held[name]` says that `state[name]` holds only a box of the checkpoint tensor (a
    sampler rank's slice): records over other boxes are skipped, and of a record that covers
    more than the slice, the chunks inside it alone are staged, each checked against its own
    digests (a record whose chunks straddle the slice raises PackMismatchError: publish with a
    `Hint`). Without `held`, state tensors are whole; records over boxes (a trainer rank's
    part) patch their box. Tensors of the pack missing from the state raise, unless `held` is
    given (then they are skipped).

    Checks the container (checksums), that the pack fits the state (names, shapes, dtypes,
    `base_version` if given), with `check_base` that the state holds the pack's base weights
    (one read of the state), and that the patched weights will have the promised digests.
    Raises a typed error (weight_teleport.errors) otherwise. `limits`: what the pack may
    declare beyond the spec's rules (`PackLimits`; its defaults pass any real model's pack).

    For a state on a CUDA device, a staged patch of more than `device_budget` bytes is moved
    to pinned host memory (room for the sampler's KV cache; `apply_staged` then copies it
    back, a longer pause); None keeps it in device memory. CPU patches live on the host.

    `pack` is any bytes-like object; one in pinned host memory (`pinned_pack`) is copied to
    CUDA weights' device with no host copy first.

    CUDA weights decode every stream codec a pack may use with nvCOMP, the GPU-only ones
    (lz4, nvcomp-ans) too; `cuda`, a `CudaCodecConfig`, picks nvCOMP's decompression backend
    (`decompress_backend`; its `stream_coder` is ignored: each stream names its codec). CPU
    weights decode the portable codecs (raw, zstd) and refuse the others.

    `header`: the pack's header as `read_header(pack, limits=limits)` returned it, where the
    caller parsed it already (a subscriber, when it checked the object); it is not parsed
    again."""
    header = read_header(pack, limits=limits) if header is None else header
    if header.kind == "delta" and base_version is not None and header.base_version != base_version:
        raise PackMismatchError(
            f"pack applies to version {header.base_version}, the state is at version {base_version}"
        )
    backend, lives, walks, windows = _lives(state, header, strict, held)
    backend.check_stage(header, windows)
    staged = backend.stage(lives, header, pack, check_base and header.kind == "delta", threads, windows, cuda)
    staged.walks = walks  # apply_staged writes records over boxes through the same views
    if device_budget is not None and staged.nbytes > device_budget:
        staged.offload()
    return staged


def in_turn(writes: list[Callable[[], None]]) -> Callable[[], None]:
    """One function that calls `writes` in order."""

    def write() -> None:
        for w in writes:
            w()

    return write


def bind_staged(
    state: MutableMapping[str, torch.Tensor],
    staged: StagedPatch | StagedParts,
    threads: int | None = None,
    relocate: bool = False,
) -> Callable[[], None]:
    """`apply_staged`'s host work done now (the views of `state` the patch writes, their
    addresses checked, a patch staged elsewhere moved onto them with `relocate`), its writes
    returned as a function: a sampler binds before its pause, which then only writes. The
    function writes into the tensors `state` held when it was bound."""
    if isinstance(staged, StagedParts):
        return in_turn([bind_staged(state, patch, threads, relocate) for patch in staged.patches])
    backend = _backend(state[t.name] for t in staged.tensors)
    walks = getattr(staged, "walks", {})
    lives = {
        t.name: backend.Live(W.walk_view(state[t.name], *walks[t.name]) if t.name in walks else state[t.name], t.info)
        for t in staged.tensors
    }
    return backend.bind(lives, staged, threads, relocate)


@collections_paused()
def apply_staged(
    state: MutableMapping[str, torch.Tensor],
    staged: StagedPatch | StagedParts,
    threads: int | None = None,
    relocate: bool = False,
) -> None:
    """Write a staged patch into `state` in place (the only step that modifies weights).
    `relocate`: `state` holds the weights the patch was staged against, possibly in other
    memory (a patch staged against a copy of them); without it, a CUDA patch refuses
    tensors that moved since it was staged."""
    bind_staged(state, staged, threads, relocate)()


def apply_delta(
    state: MutableMapping[str, torch.Tensor],
    pack: PackBuffer,
    *,
    base_version: int | None = None,
    check_base: bool = True,
    strict: bool = True,
    threads: int | None = None,
    cuda=None,
    limits: PackLimits | None = None,
    held: Mapping[str, TensorSlice] | None = None,
) -> ApplyReport:
    """Patch `state` in place with a delta (or overwrite it with a snapshot) pack.

    Everything is decoded and verified first (see stage_delta); a pack that does not fit
    raises before any tensor is modified."""
    t0 = time.perf_counter()
    staged = stage_delta(
        state,
        pack,
        base_version=base_version,
        check_base=check_base,
        strict=strict,
        threads=threads,
        cuda=cuda,
        limits=limits,
        held=held,
    )
    t1 = time.perf_counter()
    apply_staged(state, staged, threads)
    t2 = time.perf_counter()
    return ApplyReport(
        version=staged.version,
        base_version=staged.base_version,
        kind=staged.kind,
        tensors_patched=sum(1 for t in staged.tensors if t.chunks),
        elements_changed=staged.changed,
        pack_bytes=len(pack),
        base_checked=staged.base_checked,
        digest_verified=True,
        stage_seconds=t1 - t0,
        apply_seconds=t2 - t1,
    )


def decode_snapshot(
    pack: PackBuffer, *, threads: int | None = None, limits: PackLimits | None = None
) -> dict[str, torch.Tensor]:
    """The full weights of a snapshot pack, as new CPU tensors. Refused with PackLimitError
    before anything is allocated where they would take more than `limits.max_bytes` (by
    default this machine's physical memory), or break another of `limits`."""
    header = read_header(pack, limits=limits)
    if header.kind != "snapshot":
        raise PackMismatchError(
            f"pack is a {header.kind} for version {header.base_version}; "
            "a receiver with no weights needs a snapshot pack"
        )
    check_allocation(header.tensors, limits)
    state = {t.name: torch.empty(t.shape, dtype=BY_NAME[t.dtype].torch_dtype) for t in header.tensors}
    apply_delta(state, pack, threads=threads, limits=limits)
    return state


def check_allocation(records: Iterable[TensorRecord], limits: PackLimits | None = None) -> None:
    """PackLimitError where tensors of the records' shapes and dtypes (whole tensors: the
    records' full shapes) would take more bytes than `limits.max_bytes` allows (by default
    this machine's physical memory): checked before a receiver allocates them."""
    nbytes = sum(math.prod(t.shape) * BY_NAME[t.dtype].nbytes for t in records)
    limit = limits.max_bytes if limits is not None else None
    setting = "max_bytes"
    if limit is None:
        limit, setting = _physical_memory(), "max_bytes (default: this machine's physical memory)"
    if limit is not None and nbytes > limit:
        raise over_limit("tensors' bytes", nbytes, limit, setting)


def _physical_memory() -> int | None:
    """Bytes of this machine's memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def tensor_digest(tensor: torch.Tensor) -> str:
    """The digest (16 hex digits, docs/FORMAT.md) of a tensor's bytes, as packs carry it:
    compare it with a pack's record to verify weights after applying. Computed where the
    tensor is (for a CUDA tensor, one reduction on its GPU; the same digest)."""
    return _backend([tensor]).digest(tensor)


def tensor_digests(tensors: list[torch.Tensor]) -> list[str]:
    """`tensor_digest` of each tensor (all on the CPU or all on CUDA devices); CUDA tensors
    of one device are reduced in one launch and read back in one transfer."""
    return _backend(tensors).digests(tensors) if tensors else []


def inspect(pack: PackBuffer, *, limits: PackLimits | None = None) -> dict:
    """Header fields and size statistics of a pack (reads only the preamble and header)."""
    header = read_header(pack, limits=limits)
    tensors = []
    for t in header.tensors:
        nbytes = sum(c.length for c in t.chunks)
        tensors.append(
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "codec": t.codec,
                "changed": t.changed,
                "density": t.changed / max(t.numel, 1),
                "bytes": nbytes,
                "chunks": len(t.chunks),
                "digest": t.digest,
            }
        )
    numel = sum(t.numel for t in header.tensors)
    changed = sum(t.changed for t in header.tensors)
    return {
        "format_version": header.format_version,
        "kind": header.kind,
        "version": header.version,
        "base_version": header.base_version,
        "chunk_elems": header.chunk_elems,
        "stream_codecs": header.stream_codecs,
        "tensors": tensors,
        "numel": numel,
        "changed": changed,
        "density": changed / max(numel, 1),
        "pack_bytes": len(pack),
        "header_bytes": header.payload_offset,
        "bits_per_element": 8 * len(pack) / max(numel, 1),
    }
