"""One engine worker stages a version on its own, against its own parameters.

The worker reads the pack's header alone (ranged reads), finds per record the chunks inside
its slice (`codec.slices.chunk_window`), fetches only their bytes (adjacent ranges merged
into one read, into a buffer laid out as the pack: pinned host memory for CUDA parameters)
and stages them with the codec's own `stage_delta` against its slices (`held`: each slice
seen as its box of the checkpoint tensor, a view of the parameter), on the parameters'
device: the CUDA backend decodes on the worker's GPU and keeps the staged patch there, the
CPU backend on the host. Each run of chunks is checked against its CRC-32s and its chunk
digests (format version 2): the proof that the slice's result is the trainer's, without
the rest of the tensor. A version made of parts (a `PublisherGroup`'s trainer ranks' packs)
is read from the parts whose boxes overlap the worker's slices alone. What comes out is a
`Step`: staged patches, written by `apply_steps` alone, the pause's only work.

Versions staged but not yet applied are `pending`: a delta staged after them is staged
against a copy of the slices with the pending versions applied (on the parameters' device
where it has room, else on the host), so a worker can stage a chain of versions ahead of
the pause; the patches of such a version are written into the parameters with `relocate`.
Applying a version twice writes the same values, so a commit that applies a pending version
while a later one stages changes nothing in what that one reads.

Layouts come from `targets.vllm_layout.Slice` (fused qkv_proj / gate_up_proj, column-,
row- and vocab-parallel shards, experts of stacked fused-MoE parameters); this module knows
no engine. The model's tensors a worker holds no element of (`WorkerSlices.absent`: other
ranks' experts) are skipped: their chunks are never read, their parts never fetched."""

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec import apply_staged, bind_staged, stage_delta
from weight_teleport.codec.api import in_turn
from weight_teleport.codec import walks as W
from weight_teleport.codec.slices import chunk_byte_ranges, chunk_window
from weight_teleport.errors import PackMismatchError
from weight_teleport.format import PackHeader, read_header
from weight_teleport.pipeline.errors import ObjectRejected
from weight_teleport.pipeline.fetch import FETCH_THREADS, RANGE_BYTES, check_covers, check_parts_whole, part_entry
from weight_teleport.format.manifest import Entry
from weight_teleport.format.parts import Part
from weight_teleport.targets.slice_view import box_view
from weight_teleport.targets.vllm_layout import Slice, absent_of

HEADER_PROBE = 16 << 10
"""Bytes read first: the preamble and, for most packs, the whole header (chunks inside
these bytes are not read again)."""
MAX_GAP = 1 << 10
"""Two chunk ranges at most this far apart are fetched in one read: fewer requests for a
few bytes of other ranks' chunks (the small records of replicated tensors lie between)."""
SHADOW_HEADROOM = 1 << 30
"""Device memory left free when a copy of the slices is made there for a chained stage."""


@dataclass(frozen=True)
class Step:
    """One version staged on one worker."""

    version: int
    kind: str
    slices: Mapping[str, Slice]
    """The worker's slices the patches were staged for (`held_state`)."""
    patches: tuple
    """Staged patches (one per pack read) of the slices, as `held_state` sees them."""
    packs: tuple
    """(bytes, header) of each pack read (its chunks outside the slices unread): what a
    copy of the slices on the host is advanced with (`_shadow`)."""
    relocate: bool
    """Staged against a copy of the slices (versions were pending): written with `relocate`."""
    fetched: int
    """Bytes read from the store for it."""
    fetch_s: float
    """Seconds spent reading them (the rest of the stage decodes, checks and binds)."""
    params: Mapping[str, torch.Tensor]
    """The parameters `write` writes into (by name, as `params()` gave them at staging)."""
    write: Callable[[], None]
    """The patches' writes, bound to `params` while staging (`codec.bind_staged`): the pause
    only launches them."""

    @property
    def nbytes(self) -> int:
        """Memory the staged patches hold."""
        return sum(p.nbytes for p in self.patches)


def read_pack_header(store, entry: Entry) -> tuple[PackHeader, bytes]:
    """The header of `entry`'s pack from its first bytes alone, checked against the entry;
    (header, the first bytes read)."""
    first = store.get_range(entry.key, 0, min(entry.size, HEADER_PROBE))
    if len(first) >= 12:
        need = 24 + int.from_bytes(first[8:12], "little")
        if len(first) < need <= entry.size:
            first += store.get_range(entry.key, len(first), need)
    header = read_header(first, total_length=entry.size)
    if (header.kind, header.version, header.base_version) != (entry.kind, entry.version, entry.base):
        raise ObjectRejected(
            f"{entry.key}: holds a {header.kind} to version {header.version} from "
            f"{header.base_version}, the manifest lists a {entry.kind} to {entry.version} "
            f"from {entry.base}"
        )
    return header, first


def held_box(s: Slice) -> W.Box:
    """The box of the checkpoint tensor that slice `s` holds."""
    rest = tuple((0, d) for d in s.shape[1:])
    if s.order == "rows":
        return ((s.lo, s.hi - s.lo),) + rest
    return ((0, s.shape[0]), (s.lo, s.hi - s.lo)) + rest[1:]


def held_state(
    params: Mapping[str, torch.Tensor], slices: Mapping[str, Slice]
) -> tuple[dict[str, torch.Tensor], dict[str, W.TensorSlice]]:
    """(state, held): each slice as its box of the checkpoint tensor (a view of its
    parameter), and that box: what `stage_delta` and `apply_staged` take for this worker."""
    state = {name: box_view(params[s.param], s) for name, s in slices.items()}
    held = {name: W.TensorSlice(s.shape, held_box(s)) for name, s in slices.items()}
    return state, held


class HeldViews:
    """One worker's `held_state`, kept between versions and made again only where a
    parameter is another tensor or lies elsewhere than last time (some hundreds of views of
    an engine's parameters are milliseconds of Python). Its owner's: the views keep the
    parameters they view alive as long as it keeps them."""

    def __init__(self, slices: Mapping[str, Slice]):
        self.slices = slices
        self._last: tuple | None = None
        """(key of the parameters, their views): one object, replaced whole (the follower
        stages and the commit applies on different threads)."""

    def of(self, params: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, W.TensorSlice]]:
        key = tuple((n, id(t), t.data_ptr()) for n, t in params.items())
        last = self._last
        if last is None or last[0] != key:
            last = self._last = (key, held_state(params, self.slices))
        return last[1]


def _fetch_into(store, key: str, ranges: list[tuple[int, int]], prefix: bytes, pinned: bool) -> tuple[np.ndarray, int]:
    """A buffer laid out as the pack up to the end of the last of `ranges` (pinned host
    memory with `pinned`) holding its first bytes `prefix` and each of `ranges`, read
    straight into it (adjacent ones together, in pieces of at most RANGE_BYTES on
    FETCH_THREADS threads where the store serves ranges in parallel); the rest is never
    read. (buffer, bytes read)."""
    end = max([len(prefix)] + [b for _, b in ranges])
    # the manifest's size and the header are the store's word: the object's last byte needed
    # is read before memory is taken for the bytes up to it
    if end > len(prefix) and len(store.get_range(key, end - 1, end)) != 1:
        raise ObjectRejected(f"{key}: the object ends before byte {end}, where its header puts a chunk")
    if pinned:  # CUDA parameters only: the CUDA backend's modules need triton
        from weight_teleport.codec.cuda.runtime.memory import pinned_empty

        buf = pinned_empty(end)
    else:
        buf = np.empty(end, np.uint8)
    buf[: len(prefix)] = np.frombuffer(prefix, np.uint8)
    spans = sorted((max(a, len(prefix)), b) for a, b in set(ranges) if b > len(prefix))
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo - merged[-1][1] <= MAX_GAP:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    pieces = [(a, min(a + RANGE_BYTES, hi)) for lo, hi in merged for a in range(lo, hi, RANGE_BYTES)]

    def read(piece: tuple[int, int]) -> int:
        lo, hi = piece
        got = store.get_range_into(key, lo, buf[lo:hi])
        if got != hi - lo:
            raise ObjectRejected(f"{key}: a ranged read of [{lo}, {hi}) returned {got} bytes")
        return got

    if len(pieces) > 1 and store.parallel_ranges:
        with ThreadPoolExecutor(min(FETCH_THREADS, len(pieces)), thread_name_prefix="wt-worker-fetch") as pool:
            return buf, sum(pool.map(read, pieces))
    return buf, sum(map(read, pieces))


def _shadow(state: dict[str, torch.Tensor], held, pending: Sequence[Step]) -> tuple[dict[str, torch.Tensor], bool]:
    """(a copy of the slices with the pending steps applied, whether it lies on the host
    while the parameters are on a CUDA device). On the parameters' device where it leaves
    SHADOW_HEADROOM free (the pending patches written into it), else on the host (the
    pending packs staged again there: the CPU decodes the chain, a slower stage)."""
    first = next(iter(state.values()))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    if not first.is_cuda or torch.cuda.mem_get_info(first.device)[0] >= nbytes + SHADOW_HEADROOM:
        # each copy keeps its slice's strides: the patches address elements through them
        copy = {
            name: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
            for name, t in state.items()
        }
        for step in pending:
            for patch in step.patches:
                apply_staged(copy, patch, relocate=True)
        return copy, False
    copy = {name: t.cpu() for name, t in state.items()}
    for step in pending:
        for data, header in step.packs:
            apply_staged(copy, stage_delta(copy, data, header=header, held=held, strict=False))
    return copy, True


def stage_entry(
    store,
    entry: Entry,
    params: Mapping[str, torch.Tensor],
    slices: Mapping[str, Slice],
    pending: Sequence[Step] = (),
    device_budget: int | None = None,
    views: HeldViews | None = None,
) -> Step:
    """Stage `entry`'s pack on this worker (parameters `params` by name, its `slices` by
    checkpoint name), after the `pending` steps. Raises a typed error where the pack does
    not fit this worker or a chunk fails its checks; nothing is written. An entry made of
    parts (trainer ranks' packs) is staged from the parts whose boxes overlap this worker's
    slices alone: the others are never read. `device_budget`: bytes of device memory the
    staged patches of CUDA parameters may hold, together with the pending ones'; beyond it
    they move to pinned host memory (a longer pause). `views`: the worker's `HeldViews` of
    `slices`, where it keeps one.

    CUDA parameters are staged on a stream of the worker's own, beside the engine's work;
    the step is complete on the device when this returns."""
    state, held = views.of(params) if views is not None else held_state(params, slices)
    if not state_on_cuda(state):
        return _stage(store, entry, params, slices, state, held, pending, device_budget)
    from weight_teleport.codec.cuda.runtime.memory import side_stream  # CUDA parameters only

    device = next(iter(state.values())).device
    stream = side_stream(device, "worker-stage")
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        step = _stage(store, entry, params, slices, state, held, pending, device_budget)
    stream.synchronize()
    return step


def _stage(store, entry: Entry, params, slices, state, held, pending: Sequence[Step], device_budget) -> Step:
    base, on_host = state, False
    if pending and entry.kind == "delta":  # a snapshot reads none of the weights it replaces
        base, on_host = _shadow(state, held, pending)
    pinned = state_on_cuda(state) and not on_host
    if device_budget is not None:
        device_budget = max(0, device_budget - sum(s.nbytes for s in pending))
    patches, packs, read, fetch_s = [], [], 0, 0.0
    for part in [None] if not entry.parts else _overlapping_parts(entry, slices):
        e = entry if part is None else part_entry(entry, part)
        t0 = time.perf_counter()
        header, prefix = read_pack_header(store, e)
        _check_names(header, slices)
        if part is not None:
            check_covers(header, part)
        data, n = _fetch_into(store, e.key, _chunk_ranges(header, held), prefix, pinned)
        fetch_s += time.perf_counter() - t0
        patch = stage_delta(
            base,
            data,
            header=header,
            held=held,
            strict=False,
            device_budget=device_budget,
            base_version=entry.base if entry.kind == "delta" else None,
        )
        if on_host:  # the CPU staged it: the CUDA backend's form for the parameters
            from weight_teleport.codec.cuda.stage.patch import DevicePatch

            patch = DevicePatch.of_host(patch)  # type: ignore[assignment]  # the same patch, in that form
        patches.append(patch)
        packs.append((data, header))
        read += len(prefix) + n
    relocate = base is not state
    write = in_turn([bind_staged(state, p, relocate=relocate) for p in patches])
    return Step(
        entry.version, entry.kind, slices, tuple(patches), tuple(packs), relocate, read, fetch_s, dict(params), write
    )


def state_on_cuda(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a worker's parameters (all on one device) are CUDA tensors."""
    return next(iter(state.values())).is_cuda


def _check_names(header: PackHeader, slices: Mapping[str, Slice]) -> None:
    extra = sorted({r.name for r in header.tensors} - set(slices) - set(absent_of(slices)))
    if extra:
        raise PackMismatchError(f"the pack holds tensor {extra[0]!r}, which this engine's model lacks")


def _chunk_ranges(header: PackHeader, held: Mapping[str, W.TensorSlice]) -> list[tuple[int, int]]:
    """The pack's byte ranges holding the chunks inside this worker's slices (`_fetch_into`
    merges those that touch)."""
    out = []
    for rec in header.tensors:
        if rec.name not in held:  # a tensor of the model this worker holds none of
            continue
        box = W.whole(rec.shape) if rec.box is None else tuple(map(tuple, rec.box))
        if W.intersect(box, held[rec.name].box) == box:  # all of the record: no walk to look at
            i, j = 0, len(rec.chunks)
        else:
            _, i, j = chunk_window(header, rec, held[rec.name].box)
        out += chunk_byte_ranges(header, rec, i, j)
    return out


def _overlapping_parts(entry: Entry, slices: Mapping[str, Slice]) -> list[Part]:
    """The parts of `entry` that hold elements of this worker's slices, after
    checking the manifest's covers (disjoint, and here covering every tensor whole), so that
    every element of a slice lies in exactly one staged record."""
    absent = absent_of(slices)
    extra = sorted({name for p in entry.parts for name, _ in p.covers} - set(slices) - set(absent))
    if extra:
        raise PackMismatchError(f"the version holds tensor {extra[0]!r}, which this engine's model lacks")
    check_parts_whole(entry, {**absent, **{n: s.shape for n, s in slices.items()}})
    return [
        p
        for p in entry.parts
        if any(name in slices and W.intersect(box, held_box(slices[name])) for name, box in p.covers)
    ]


def apply_steps(params: Mapping[str, torch.Tensor], steps: Sequence[Step], views: HeldViews | None = None) -> None:
    """Write the steps into the parameters in place, in order (later writes win): the
    writes bound while staging where `params` are the tensors they were bound to, else
    bound again to these. On CUDA the writes are queued on the current stream: keep the
    steps until they are done (`WorkerLocal` synchronises the device in its commit), since
    their memory came from the stage's stream. `views`: the worker's `HeldViews`, where it
    keeps one."""
    for step in steps:
        if step.params.keys() == params.keys() and all(params[n] is t for n, t in step.params.items()):
            step.write()
            continue
        state, _ = (
            views.of(params) if views is not None and views.slices is step.slices else held_state(params, step.slices)
        )
        for patch in step.patches:
            apply_staged(state, patch, relocate=step.relocate)


def warm_up(device: torch.device, dtypes) -> None:
    """Stage and apply, on scratch tensors of CUDA `device`, a small delta of each element
    type of `dtypes` over slices as a worker holds them (a run of rows, and a strided block
    of columns, each some chunks of a record cut at its bounds), so that no kernel is
    compiled or loaded in a worker's first pause, nor its first stage."""
    from weight_teleport.codec import encode_delta
    from weight_teleport.subscribe.stager import warm_pair

    for dtype in sorted(set(dtypes), key=str):
        old, new = warm_pair(dtype)
        rows = old.numel() // 64 // 8 * 8
        old, new = old[: rows * 64].view(rows, 64), new[: rows * 64].view(rows, 64)
        for order, bound, box in (
            ("rows", rows // 2 * 64, ((0, rows // 2), (0, 64))),
            ("cols", 32 * rows, ((0, rows), (32, 32))),
        ):
            pack = encode_delta({"w": old}, {"w": new}, base_version=0, version=1, hints={"w": W.Hint(order, (bound,))})
            sub = tuple(slice(o, o + e) for o, e in box)
            live = {"w": old.to(device)[sub]}  # a view of a larger tensor, as a worker's slice is
            held = {"w": W.TensorSlice(tuple(old.shape), box)}
            apply_staged(live, stage_delta(live, pack, base_version=0, held=held))
            if not torch.equal(live["w"].cpu().view(torch.uint8), new[sub].contiguous().view(torch.uint8)):
                raise RuntimeError(f"warming up the worker's {order} stage of {dtype} gave other weights")
    torch.cuda.synchronize(device)
