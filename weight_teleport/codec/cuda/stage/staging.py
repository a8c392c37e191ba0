"""Staging a pack against live CUDA weights: decode and verify, write nothing.

Sparse tensors are staged on the GPU, batched per element type and codec, each codec's
records by the stager its line in the registry names (codec/registry.py: `SparseStage`
here for `sparse`, codec/cuda/stage/sparse.py's batches; adaptive.py's for `sparse_ac`).
A stager is made with (lives, records, header, pack, threads, config) before the records
staged on the host, and may start host work on helper threads; `launch()` then returns
its launched `SparseBatch`es, `close()` waits for its helpers, and `crcs` (with `spans`)
are its chunks' CRC-32s computed on the device, checked after the read-back (None: it
checked them itself). The checks of all batches and the digests are read back in one
transfer. Snapshots of raw byte planes (the CUDA encoder's) are staged on the GPU too
(codec/cuda/snapshot.py); other snapshots, the dense chunks of a delta (rare in a delta
stream) and a codec without a CUDA stager go through the CPU backend on host tensors."""

import dataclasses
import os
import re
from concurrent.futures import ThreadPoolExecutor, wait
from typing import cast

import numpy as np
import torch
from numba import njit

from weight_teleport.codec import digest as D
from weight_teleport.codec import registry
from weight_teleport.codec.cuda import snapshot
from weight_teleport.codec.cuda.kernels import chunk_table, stage_scatter
from weight_teleport.codec.cuda.runtime import memory, nvcomp
from weight_teleport.codec.cuda.stage import decode_streams, sparse
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.kernels.crc import crc32
from weight_teleport.codec.cuda.kernels.digest import word_sums
from weight_teleport.codec.cuda.live import Live, grouped, walk_2d
from weight_teleport.codec.cuda.stage.patch import DevicePatch, DeviceTensorPatch, FusedGroup, ScatterGroup, WalkGroup
from weight_teleport.codec.cuda.stage.sparse import FLAGS, SparseBatch
from weight_teleport.codec.cuda.stage.windows import windowed
from weight_teleport.codec.patch import ChunkPatch, misfit
from weight_teleport.codec.plan import Runs, class_maps, run_arrays
from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.format.container import ChunkSpans, crc32_ranges


SAME = registry.family("same")


def _on_host(lives: dict[str, Live], recs, header, pack, check_base: bool, threads, cut: dict) -> dict:
    """Dense and snapshot tensors, and those of a codec without a CUDA stager: a snapshot's
    raw byte planes of regular chunks on the device (codec/cuda/snapshot.py), the rest
    (records with cuts, and records staged in part, `cut`: `windows.windowed`'s) through the
    CPU backend on host copies (of the live tensors for a delta, whose chunks decode against
    them); each chunk's new values as one run from its start (`_run`)."""
    if not recs:
        return {}
    if (
        header.kind == "snapshot"
        and not any(r.cuts or r.name in cut for r in recs)
        and snapshot.raw_planes(header, pack, recs)
    ):
        return snapshot.stage(lives, header, pack, recs, header.chunk_elems)
    cpu = registry.backend("cpu")  # looked up at each call: tests stand in for its functions
    host, windows = {}, {}
    for r in recs:
        live = lives[r.name]
        if header.kind == "snapshot":
            tensor = torch.empty(live.u.numel() if r.name in cut else live.tensor.shape, dtype=live.tensor.dtype)
        else:
            tensor = (live.u.view(live.tensor.dtype) if r.name in cut else live.tensor).detach().cpu()
        host[r.name] = cpu.Live(tensor, live.info)
        if r.name in cut:
            windows[r.name] = cut[r.name][1]
    sub = dataclasses.replace(header, tensors=[cut[r.name][0] if r.name in cut else r for r in recs])
    staged = cpu.stage(host, sub, pack, check_base, threads, windows)
    return {
        t.name: [(c.start, _upload(_run(c, host[t.name].u), lives[t.name])) for c in t.chunks] for t in staged.tensors
    }


def _run(chunk: ChunkPatch, old: np.ndarray) -> np.ndarray:
    """A chunk's new values from its start on: a dense chunk's, or a sparse chunk's changes
    over the `old` values (the host copy it was staged against) up to its last change."""
    if chunk.positions is None:
        return chunk.values
    run = old[chunk.start : chunk.start + (int(chunk.positions[-1]) + 1 if chunk.positions.size else 0)].copy()
    run[chunk.positions] = chunk.values
    return run


def _upload(values: np.ndarray, live: Live) -> torch.Tensor:
    signed = np.dtype(f"<i{live.info.nbytes}") if live.info.nbytes > 1 else np.dtype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(values).view(signed)).to(live.tensor.device)


def _check_crcs(pack, spans: ChunkSpans, threads) -> None:
    """Every chunk's CRC-32 on host threads."""
    # read_header has checked that every chunk lies inside the pack
    spans.compare(crc32_ranges(pack, spans.starts, spans.lengths, threads or os.cpu_count() or 1))


def _device_crcs(upload: decode_streams.Upload, spans: ChunkSpans) -> torch.Tensor:
    """The chunks' CRC-32s computed on the device from their uploaded bytes (int32), on a
    stream of their own that starts once the decompression is done: no decoding kernel
    needs them, and queued ahead of the decompression they delayed it. The caller's stream
    waits for them."""
    main = torch.cuda.current_stream(upload.device)
    side = memory.side_stream(upload.device, "crc")
    side.wait_stream(decode_streams.stream(upload.device))
    with torch.cuda.stream(side):
        crcs = crc32(upload.bytes(), spans.starts - upload.lo, spans.lengths)
    main.wait_stream(side)
    crcs.record_stream(main)
    return crcs


def _check_base(rec, nbytes: int, s_old: int, header) -> None:
    if D.to_hex(D.finish(s_old, nbytes)) != rec.base_digest:
        raise PackMismatchError(
            f"tensor {rec.name!r} does not hold the weights of base version {header.base_version} "
            f"(digest {D.to_hex(D.finish(s_old, nbytes))}, expected {rec.base_digest}): the state is at "
            "another version or was modified; resync from a snapshot"
        )


def _check_result(rec, nbytes: int, s_old: int, s_new: int) -> None:
    predicted = D.finish(D.word_sum(D.from_hex(rec.base_digest), nbytes) + s_new - s_old, nbytes)
    if predicted != D.from_hex(rec.digest):
        raise DigestMismatchError(
            f"tensor {rec.name!r}: the patched weights would have digest {D.to_hex(predicted)}, "
            f"the pack promises {rec.digest}; the pack is corrupt or was encoded from other weights"
        )


_HEX = re.compile(r"[0-9a-f]*")


def _digest_words(texts: list) -> np.ndarray | None:
    """The digests as uint64, or None unless every one is 16 lowercase hex digits (the form
    the writers produce)."""
    joined = "".join(t if isinstance(t, str) else "" for t in texts)
    if len(joined) != 16 * len(texts) or not _HEX.fullmatch(joined):
        return None
    return np.frombuffer(bytes.fromhex(joined), ">u8").astype(np.uint64)


def _record_digests(recs) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(base digests, digests) of the records as `_digest_words`: made before the read-back,
    while the device works."""
    return _digest_words([r.base_digest for r in recs]), _digest_words([r.digest for r in recs])


def _digest_failures(
    recs, nbytes: np.ndarray, sums: np.ndarray, digests: tuple | None = None
) -> tuple[list[int], list[int]]:
    """(the records whose base digest the old weights miss, those whose promised digest the
    patched weights would miss), from the device's word sums (`sums` [records, 2] int64: old,
    new) in uint64 arithmetic over all records at once; every record where a digest is not in
    the writers' form. `_check_base` and `_check_result` then judge only these and raise, so
    the errors are theirs, while the call's tail after the device's work stays one vectorised
    pass instead of a Python loop over the records (bench/investigations/stage_host.py times both).
    `digests`: `_record_digests(recs)`, made already."""
    base, new = digests or _record_digests(recs)
    if base is None or new is None:
        return list(range(len(recs))), list(range(len(recs)))
    s = sums.view(np.uint64)
    with np.errstate(over="ignore"):  # mod 2^64, as codec/digest.py
        old = s[:, 0] + nbytes * np.uint64(D.LENGTH_MULT)
        patched = base + s[:, 1] - s[:, 0]  # finish(word_sum(base) + new - old)
    return np.flatnonzero(old != base).tolist(), np.flatnonzero(patched != new).tolist()


def _by_type(lives: dict[str, Live], recs) -> list[list]:
    """The records grouped by dtype (a batch each), in header order within a group."""
    return grouped(recs, lambda r: lives[r.name].info.name)


_helpers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="weight-teleport-stage")
"""Threads that read a stage call's stream tables (`sparse.StreamsRead`) while its own
thread launches the class counts."""


def _start_reads(pack, groups: list[list], runs: list[Runs], spans: ChunkSpans, uploaded: bool, reads: list) -> None:
    """Starts each group's stream-table walk on a helper thread (into `reads`), on the classes
    its records' class-map runs give (`runs`): `plan.class_maps` checks the maps later, and a
    valid map's runs give its count. `spans` holds the groups' chunks end to end, `uploaded`:
    all of them go to the device in one `decode_streams.Upload`."""
    cuts = np.cumsum([0] + [sum(len(r.chunks) for r in rs) for rs in groups]).tolist()
    for rs, rn, a, b in zip(groups, runs, cuts[:-1], cuts[1:]):
        part = spans.part(a, b)
        lo, hi = (spans.bounds()[0], None) if uploaded else part.bounds()
        reads.append(sparse.StreamsRead(pack, part, rs, rn.top_classes() + 1, lo, hi, _helpers))


def _batches(
    lives: dict[str, Live],
    groups: list[list],
    runs: list[Runs],
    header,
    spans: ChunkSpans,
    pack,
    threads,
    upload,
    reads: list,
    config: CudaCodecConfig | None,
) -> tuple[list[SparseBatch], torch.Tensor | None]:
    """(a SparseBatch per group, the chunks' CRC-32s where the pack was copied to the device,
    else None); `reads`: the groups' stream-table walks (`_start_reads`). The device runs
    what is queued in order, each kernel's blocks before the next one's, and the class
    counts fill every SM until their last blocks start: they are launched first, then the
    pack's copy is queued,
    then the decompression is launched once the walk is done, then the rest of the decoding,
    then the CRCs, which wait for the decompression (`_device_crcs`)."""
    maps = [class_maps(rs, lives[rs[0].name].info, rn) for rs, rn in zip(groups, runs)]
    # the walk's tables have the shape of the classes it was given: those of the maps, once checked
    assert all(np.array_equal(m[2], r.n_classes) for m, r in zip(maps, reads))
    batches = [SparseBatch([lives[r.name] for r in rs], rs, header, m) for rs, m in zip(groups, maps)]
    if upload is not None:
        upload.start()
    for b, r in zip(batches, reads):
        b.decompress(pack, r.result(b.table.base.device, config), threads, upload)
    for b in batches:
        b.decode()
    crcs = _device_crcs(upload, spans) if upload is not None else None
    return batches, crcs


def _read_back(batches: list[SparseBatch], same_sums: torch.Tensor | None, crcs: list[torch.Tensor]):
    """(flags [batches, 3], digest sums [tensors, 2] int64 (old, new) per sparse tensor then
    per `same` tensor (its word sum twice), each of `crcs`, chunk CRC-32s): one transfer."""
    n_crcs = [c.numel() for c in crcs]
    parts = (
        [b.flags.long() for b in batches]
        + [b.sums.view(-1) for b in batches]
        + ([] if same_sums is None else [same_sums.repeat_interleave(2)])
        + [c.long() & 0xFFFFFFFF for c in crcs]
    )
    host = torch.cat(parts).cpu().numpy() if parts else np.zeros(0, np.int64)
    n, tail = 3 * len(batches), host.size - sum(n_crcs)
    bounds = np.cumsum([tail, *n_crcs]).tolist()
    return host[:n].reshape(-1, 3), host[n:tail].reshape(-1, 2), [host[a:b] for a, b in zip(bounds, bounds[1:])]


def _launched(
    lives: dict[str, Live],
    groups: list[list],
    runs: list[Runs],
    header,
    spans: ChunkSpans,
    pack,
    threads,
    reads: list,
    uploaded: bool,
    config: CudaCodecConfig | None,
) -> tuple[list[SparseBatch], torch.Tensor | None]:
    """`_batches`, with the pack's bytes on their way to the device (`uploaded`: to be
    decompressed there by nvCOMP)."""
    # the sparse chunks' bytes go to the device on a host thread while this thread launches
    # the class counts; their CRC-32s are computed there from the uploaded bytes (on host
    # threads where nvCOMP is missing and the GPU gets decoded streams instead) and checked
    # first after the one read-back: nothing is written before they pass, and a corrupt
    # chunk is reported as such, whatever else it broke
    with ThreadPoolExecutor(max_workers=1) as pool:
        upload, on_host = None, None
        if uploaded:
            device = lives[groups[0][0].name].tensor.device
            upload = decode_streams.Upload(pack, *spans.bounds(), device, pool)  # past the pack: raises, as the CRCs do
        else:
            on_host = pool.submit(_check_crcs, pack, spans, threads)
        try:
            batches, crcs = _batches(lives, groups, runs, header, spans, pack, threads, upload, reads, config)
        except Exception:
            _check_crcs(pack, spans, threads)  # bytes that fail their CRC explain any error
            raise
        if on_host:
            on_host.result()
    return batches, crcs


class SparseStage:
    """The `sparse` records' stager (module docstring): made first, it starts each element
    type's stream-table walk on a helper thread, which runs while the host stages its
    records; `launch` then launches the batches with the pack's bytes on their way to the
    device (`_launched`)."""

    def __init__(
        self, lives: dict[str, Live], recs: list, header, pack, threads: int | None, config: CudaCodecConfig | None
    ):
        self.lives, self.header, self.pack, self.threads, self.config = lives, header, pack, threads, config
        self.groups = _by_type(lives, recs)
        self.spans = ChunkSpans.of(header, [r for rs in self.groups for r in rs])
        self.uploaded = nvcomp.available()
        self.reads: list[sparse.StreamsRead] = []
        self.crcs: torch.Tensor | None = None
        self.runs = [run_arrays([r.classes for r in rs]) for rs in self.groups]
        try:
            _start_reads(pack, self.groups, self.runs, self.spans, self.uploaded, self.reads)
        except BaseException:
            self.close()
            raise

    def launch(self) -> list[SparseBatch]:
        batches, self.crcs = _launched(
            self.lives,
            self.groups,
            self.runs,
            self.header,
            self.spans,
            self.pack,
            self.threads,
            self.reads,
            self.uploaded,
            self.config,
        )
        return batches

    def close(self) -> None:
        """Waits for the walks: they fill this thread's arena, which its next call rewinds."""
        wait([r.done for r in self.reads])


def stage(
    lives: dict[str, Live],
    header,
    pack,
    check_base: bool,
    threads: int | None,
    config: CudaCodecConfig | None = None,
    windows: dict | None = None,
) -> DevicePatch:
    """Decode and verify every chunk against the live weights; nothing is written. `config`:
    nvCOMP's decompression backend (`decompress_backend`). `windows`: the records staged in
    part, as `windows.windowed` takes them; each such run of chunks is checked against its chunk
    digests."""
    memory.begin_call()
    lives, header, cut = windowed(lives, header, windows or {})
    check = check_base and header.kind == "delta"
    by_codec = registry.grouped(header.tensors)  # in the registry's order: `sparse` first
    stagers = {name: registry.cuda_stager(name) for name in by_codec if name not in SAME}
    stages = []
    try:
        for name, stager in stagers.items():
            if stager is not None:
                stages.append(stager(lives, by_codec[name], header, pack, threads, config))
        dense = _on_host(
            lives,
            [r for r in header.tensors if r.codec in stagers and stagers[r.codec] is None],
            header,
            pack,
            check,
            threads,
            cut,
        )
        batches = [b for st in stages for b in st.launch()]
    finally:
        for st in stages:
            st.close()
    patch = _patch(lives, header, batches, dense, check)  # host work while the device decodes
    # records are cut only where `windows` names them
    patch.windows = {
        name: (w[0] - cast(dict, windows)[name][0], lives[name].u.numel(), w[0]) for name, (_, w) in cut.items()
    }
    same = [r for r in header.tensors if r.codec in SAME and check and r.name not in cut]
    same_sums = word_sums([lives[r.name].tensor for r in same]) if same else None
    # what the digest checks need of the records, made while the device works, not on the
    # call's tail after the read-back (bench/investigations/stage_host.py times the host's steps)
    recs = [r for b in batches for r in b.recs] + same
    nbytes = np.array([r.numel * lives[r.name].info.nbytes for r in recs], np.uint64)
    digests = _record_digests(recs)
    checked = [st for st in stages if st.crcs is not None]
    flags, sums, crcs = _read_back(batches, same_sums, [st.crcs for st in checked])
    for st, c in zip(checked, crcs):
        st.spans.compare(c)
    pack_flags = flags.any(0)
    for i in (0, 1):
        if pack_flags[i]:
            raise PackFormatError(FLAGS[i])
    bad_base, bad_result = _digest_failures(recs, nbytes, sums, digests)
    if check:
        for i in bad_base:
            _check_base(recs[i], int(nbytes[i]), int(sums[i, 0]), header)
    if pack_flags[2]:
        raise misfit(header.base_version, check)  # with `check`, the base digests matched
    for i in bad_result:
        _check_result(recs[i], int(nbytes[i]), int(sums[i, 0]), int(sums[i, 1]))
    return patch


@njit(nogil=True, cache=True)
def _program_rows(elem, first, n, block, out) -> None:
    """Fills `out` with a row (chunk's first element from the base, first change, stop) per
    `block` changes of every chunk (its first change `first`, `n` changes)."""
    p = 0
    for c in range(elem.size):
        for lo in range(first[c], first[c] + n[c], block):
            out[p, 0], out[p, 1], out[p, 2] = elem[c], lo, min(lo + block, first[c] + n[c])
            p += 1


def _fused_rows(b: SparseBatch, chunks: np.ndarray, base_ptr: int) -> np.ndarray:
    """[programs, 3] (chunk's first element from the base, first change, stop) of `chunks`,
    in the thread's arena, by one compiled walk (in numpy it takes a dozen temporaries the
    size of the rows, a large share of the host's work for a large patch)."""
    n, first = b.chunk_changes[chunks], b.chunk_first_change[chunks]
    ptrs = np.array([lv.tensor.data_ptr() for lv in b.lives], np.int64)  # `chunks` are in-place tensors'
    origins = np.array([lv.origin for lv in b.lives], np.int64)
    rows = b.table.host[chunks]
    tensor = rows[:, chunk_table.TENSOR]
    elem = (ptrs[tensor] - base_ptr) // b.info.nbytes + rows[:, chunk_table.START] - origins[tensor]
    out = memory.arena().empty((int((-(-n // stage_scatter.BLOCK)).sum()), 3), np.int64)
    _program_rows(elem, first, n, stage_scatter.BLOCK, out)
    return out


def _tensor_patches(b: SparseBatch, walked: set[int]) -> list[DeviceTensorPatch]:
    """Patches of a batch's tensors; those patched neither in place nor by the batch's
    `WalkGroup` (its members `walked`) get int64 positions. A tensor's chunks are
    consecutive rows of the chunk table."""
    n, first = b.chunk_changes, b.chunk_first_change
    bounds = np.searchsorted(b.table.host[:, chunk_table.TENSOR], np.arange(len(b.recs) + 1)).tolist()
    changed = np.concatenate([[0], np.cumsum(n)])[bounds]
    out = []
    for i, (rec, live) in enumerate(zip(b.recs, b.lives)):
        t = DeviceTensorPatch(
            rec.name,
            live.info,
            rec.shape,
            D.from_hex(rec.digest),
            changed=int(changed[i + 1] - changed[i]),
            fused=live.in_place or i in walked,
        )
        if not t.fused and t.changed:
            ks = slice(bounds[i], bounds[i + 1])
            r0, dev = int(first[ks][0]), live.u.device
            starts, counts = memory.to_device([b.table.host[ks, chunk_table.START] - live.origin, n[ks]], dev)
            rep = torch.repeat_interleave(starts, counts, output_size=t.changed)
            t.positions = b.pos[r0 : r0 + t.changed].long() + rep
            t.values = b.val[r0 : r0 + t.changed]
        out.append(t)
    return out


def _walked(b: SparseBatch) -> dict[int, tuple[int, int, int]]:
    """The batch's tensors that are not contiguous but walk a 2-D view of memory (column-
    parallel shards walked by columns), by index: their `walk_2d` geometry."""
    out = {}
    for i, lv in enumerate(b.lives):
        geometry = None if lv.in_place else walk_2d(lv.tensor)
        if geometry is not None:
            out[i] = geometry
    return out


@njit(nogil=True, cache=True)
def _walk_program_rows(member, start, first, n, block, out) -> None:
    """Fills `out` with a row (member's columns 0, 4-6 from `member`, the chunk's walk
    start, first change, stop) per `block` changes of every chunk."""
    p = 0
    for c in range(start.size):
        for lo in range(first[c], first[c] + n[c], block):
            out[p, 0], out[p, 1], out[p, 2], out[p, 3] = member[c, 0], start[c], lo, min(lo + block, first[c] + n[c])
            out[p, 4], out[p, 5], out[p, 6] = member[c, 1], member[c, 2], member[c, 3]
            p += 1


def _walk_group(b: SparseBatch, walked: dict[int, tuple[int, int, int]]) -> WalkGroup | None:
    """One scatter over the changes of every `walked` tensor of a batch, written where they
    lie in memory from the batch's offsets in chunks: no copy of those tensors and no
    address per change, in the stage or in the pause."""
    if not walked:
        return None
    members = sorted(walked)
    ptrs = {b.recs[i].name: b.lives[i].tensor.data_ptr() for i in members}
    base = min(ptrs, key=ptrs.__getitem__)
    rows = b.table.host
    chunks = np.flatnonzero(np.isin(rows[:, chunk_table.TENSOR], members))
    tensor = rows[chunks, chunk_table.TENSOR]
    geometry = np.zeros((len(b.lives), 4), np.int64)  # at, inner, outer stride, inner stride
    skip = np.zeros(len(b.lives), np.int64)  # where the walk's staged part starts: origin, window
    for i in members:
        lv = b.lives[i]
        geometry[i] = ((ptrs[b.recs[i].name] - ptrs[base]) // b.info.nbytes, *walked[i])
        skip[i] = (lv.window[0] if lv.window is not None else 0) - lv.origin
    n, first = b.chunk_changes[chunks], b.chunk_first_change[chunks]
    out = memory.arena().empty((int((-(-n // stage_scatter.BLOCK)).sum()), stage_scatter.WALK_ROW), np.int64)
    _walk_program_rows(
        geometry[tensor], rows[chunks, chunk_table.START] + skip[tensor], first, n, stage_scatter.BLOCK, out
    )
    return WalkGroup(base, ptrs, memory.upload(out, b.pos.device), b.pos, b.val)


def _fused_group(b: SparseBatch) -> FusedGroup | None:
    """One scatter over the changes of every in-place tensor of a batch."""
    members = [i for i, lv in enumerate(b.lives) if lv.in_place]
    if not members:
        return None
    ptrs = {b.recs[i].name: b.lives[i].tensor.data_ptr() for i in members}
    base = min(ptrs, key=ptrs.__getitem__)
    chunks = np.flatnonzero(np.isin(b.table.host[:, chunk_table.TENSOR], members))
    rows = _fused_rows(b, chunks, ptrs[base])
    return FusedGroup(base, ptrs, memory.upload(rows, b.pos.device), b.pos, b.val)


def _strided_group(b: SparseBatch, patches: list[DeviceTensorPatch]) -> ScatterGroup | None:
    """One scatter over the changes of every tensor of a batch that is neither contiguous
    nor a 2-D walk (`_walk_group`), written where they lie in memory by int64 offsets."""
    members = [(lv, t) for lv, t in zip(b.lives, patches) if not lv.in_place and t.positions is not None]
    if not members:
        return None
    ptrs = {t.name: lv.tensor.data_ptr() for lv, t in members}
    base = min(ptrs, key=ptrs.__getitem__)
    # members have their positions, and staged tensors their values
    offsets = torch.cat(
        [
            lv.storage_offsets(cast(torch.Tensor, t.positions)) + (ptrs[t.name] - ptrs[base]) // b.info.nbytes
            for lv, t in members
        ]
    )
    values = torch.cat([cast(torch.Tensor, t.values) for _, t in members])
    for _, t in members:
        t.positions, t.values, t.fused = None, None, True
    return ScatterGroup(base, ptrs, offsets, values)


def _patch(lives: dict[str, Live], header, batches: list[SparseBatch], dense: dict, check: bool) -> DevicePatch:
    walked = [_walked(b) for b in batches]
    patches = [_tensor_patches(b, set(w)) for b, w in zip(batches, walked)]
    strided = [g for g in (_strided_group(b, ts) for b, ts in zip(batches, patches)) if g is not None]
    by_name = {t.name: t for ts in patches for t in ts}
    tensors = [
        by_name.get(rec.name)
        or DeviceTensorPatch(
            rec.name, lives[rec.name].info, rec.shape, D.from_hex(rec.digest), dense=dense.get(rec.name, [])
        )
        for rec in header.tensors
    ]
    patch = DevicePatch(header.kind, header.version, header.base_version, tensors, check)
    patch.groups = (
        [g for g in (_fused_group(b) for b in batches) if g is not None]
        + [g for g in (_walk_group(b, w) for b, w in zip(batches, walked)) if g is not None]
        + strided
    )
    return patch
