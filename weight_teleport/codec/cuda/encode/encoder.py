"""Encoding deltas of CUDA tensors, batched per element type: a scan launch over every
chunk (histograms and digests, read back in one transfer), the class plans on the CPU (the
CPU backend's code), then per element type one launch each of the class-count and events
kernels, then the chunks of the sparse codec coded from those events by the encoder that
the codec's line in the registry names (codec/registry.py: codec/cuda/encode/sparse.py's
symbol and stream coding and payload gathered on the GPU, or adaptive.py's range coder).
A large state is scanned in two waves, each planned and its
events launched while the device works on the one before (`_waves`); a wave's records are
made on the host while its events run. Snapshots are written on the device as raw byte
planes (codec/cuda/snapshot.py); dense tensors of a delta, and a codec without a CUDA
encoder, go through the CPU backend (through the registry: no backend imports another)."""

import dataclasses
import os
from collections.abc import Callable
import zlib
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from weight_teleport.codec import digest as D
from weight_teleport.codec import registry
from weight_teleport.codec.cuda import snapshot
from weight_teleport.codec.cuda.encode import sparse, sparse_chunks
from weight_teleport.codec.cuda.kernels import chunk_table
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.live import flat_bits, grouped
from weight_teleport.codec.cuda.kernels.encode_scan import SPAN, aligned, scan
from weight_teleport.codec.items import EncodeItem
from weight_teleport.codec.plan import SPARSE_MAX_DENSITY, ClassPlan, PlanTable, plan_table
from weight_teleport.format import ChunkRef, TensorRecord, prefix_bound
from weight_teleport.format.codecs import pick, picks

DEFAULT_CONFIG = CudaCodecConfig()


def _pageable(n: int) -> np.ndarray:
    return np.empty(n, np.uint8)


def _host_item(it: EncodeItem) -> EncodeItem:
    """The item with its bits copied to the host, as the CPU backend takes it."""
    to_np = lambda t: flat_bits(t, it.info).cpu().numpy().view(it.info.uint_numpy)
    return dataclasses.replace(it, new=to_np(it.new), old=None if it.old is None else to_np(it.old))


def _on_cpu(items: list[EncodeItem], chunk_elems: int, level: int, threads, codec: str):
    """(records, per-record chunk lists) through the CPU backend (sparse records of `codec`)."""
    records, chunks, _, _ = registry.backend("cpu").encode(
        [_host_item(it) for it in items], chunk_elems, level, threads, codec=codec
    )
    parts, at = [], 0
    for rec in records:
        parts.append(chunks[at : at + len(rec.chunks)])
        at += len(rec.chunks)
        rec.chunks = []
    return records, parts


def _by_type(items: list[EncodeItem], which) -> list[list[int]]:
    """Indices of `which` items grouped by dtype, in item order within a group."""
    return grouped(which, lambda i: items[i].info.name)


@dataclass
class _Scan:
    """The scan of one element type's items (those with elements)."""

    items: list[int]
    rows: np.ndarray
    """[items, 2 * n_keys + 2] int64: per item its key counts, changed key counts, old and new
    word sums."""
    hist: torch.Tensor
    """The per-block histograms of the items' programs (device)."""
    first: np.ndarray
    """Each item's first program in `hist`, then the number of programs."""
    chunks: dict[int, np.ndarray] | None = None
    """Where some item carries a digest per chunk: per item (an index into `items`), its
    chunks' [chunks, 3] int64 rows (length, old and new digest word sums)."""


WAVE_ELEMS = 1 << 26
"""Items of at least this many elements in all are scanned in two waves (`_waves`)."""


def _waves(numel: np.ndarray) -> list[list[int]]:
    """Of items of `numel` elements each, those with elements in one run, or, where they hold
    WAVE_ELEMS or more, in two
    runs, cut after the item where the first comes closest to half of the elements: the
    second wave's scan runs while the host plans the first's classes and launches its events,
    and the host plans the second's while the first's events run, so the device does not
    wait for the host's plans between the scan and the events."""
    which = np.flatnonzero(numel)
    if numel.sum() < WAVE_ELEMS or which.size < 2:
        return [which.tolist()]
    cum = np.cumsum(numel[which])
    cut = int(np.argmin(np.abs(2 * cum[:-1] - cum[-1]))) + 1
    return [which[:cut].tolist(), which[cut:].tolist()]


@dataclass
class _Launched:
    """The scans of a wave's items, per element type, queued on the device with the copy of
    their rows to the host."""

    groups: list
    """(item indices, scan.Scanned, each item's first program then the programs) per type."""
    rows: np.ndarray | None
    """The rows of every type end to end, once `copied` has passed (None: no scan)."""
    copied: torch.cuda.Event | None


def _launch_scan(items: list[EncodeItem], which: list[int], chunk_elems: int) -> _Launched:
    """The scan of items `which` (with elements), each element type launched before the
    rows of all are queued to the host in one transfer."""
    groups = []
    for g in _by_type(items, which):
        # alive until launched; a scanned item is a delta's, with its base
        olds = [aligned(cast(torch.Tensor, items[i].old)) for i in g]
        news = [aligned(items[i].new) for i in g]
        info = items[g[0]].info
        table = chunk_table.build_cached(olds, chunk_elems, SPAN, info, _cuts([items[i] for i in g]))
        done = scan(table, chunk_table.pair(news, table, info), info, any(items[i].chunk_digests for i in g))
        per = np.bincount(table.host[:, chunk_table.TENSOR], -(-table.host[:, chunk_table.LEN] // SPAN), len(g)).astype(
            np.int64
        )
        groups.append((g, done, np.concatenate([[0], np.cumsum(per)]), table.host))
    if not groups:
        return _Launched(groups, None, None)
    rows = [t.view(-1) for _, done, _, _ in groups for t in (done.rows, done.chunk_sums) if t is not None]
    return _Launched(groups, *memory.to_pinned(torch.cat(rows)))


def _cuts(items: list[EncodeItem]) -> list | None:
    """The items' chunk cuts as a chunk table takes them (None: every item's are regular)."""
    cuts = [it.cuts for it in items]
    return cuts if any(cuts) else None


def _scans(w: _Launched) -> list[_Scan]:
    """The scans of a launched wave, its rows waited for."""
    memory.wait(w.copied)
    scans, at = [], 0
    copied = cast(np.ndarray, w.rows)  # set wherever there are groups
    for g, done, first, table in w.groups:
        n = done.rows.numel()
        scan = _Scan(g, copied[at : at + n].reshape(done.rows.shape), done.hist, first)
        at += n
        if done.chunk_sums is not None:
            n = done.chunk_sums.numel()
            rows = np.concatenate([table[:, chunk_table.LEN, None], copied[at : at + n].reshape(-1, 2)], 1)
            # a tensor's chunks are consecutive rows of the table
            bounds = np.searchsorted(table[:, chunk_table.TENSOR], np.arange(len(g) + 1))
            scan.chunks = {i: rows[a:b] for i, a, b in zip(g, bounds[:-1], bounds[1:])}
            at += n
        scans.append(scan)
    return scans


def _batch_hist(s: _Scan, j: np.ndarray) -> torch.Tensor:
    """The scan's histograms of its items at positions j (ascending), one after the other:
    the scan's own where j is all of them (no copy), else its rows gathered by an index
    made on the device from the items' runs of programs (a few torch calls, however many
    items are left out: the unchanged and dense ones). An index made on the host would have
    a row per block."""
    if len(j) == len(s.items):
        return s.hist
    count = s.first[j + 1] - s.first[j]
    shift, repeats = memory.to_device([s.first[j] - memory.starts(count), count], s.hist.device)
    n = int(count.sum())
    idx = torch.repeat_interleave(shift, repeats, output_size=n) + torch.arange(n, device=s.hist.device)
    return s.hist.index_select(0, idx)


@dataclass
class _Plans:
    """A scan's class plans: per item the sparse codec the choice picks for it, and per codec
    picked the plans of every item as that codec would code it (rows of items without
    changes, or coded by the other codec, are not used)."""

    codecs: np.ndarray
    """[items] the codec of each item (str objects)."""
    tables: dict[str, PlanTable]

    def of(self, j: int) -> ClassPlan:
        """The plan of item j of the scan."""
        return self.tables[self.codecs[j]][j]


def _plans(scans: list[_Scan], changed: np.ndarray, numel: np.ndarray, choice: str) -> list[_Plans]:
    """Each scan's class plans from the scan rows as the CPU backend makes them, of the codec
    `choice` picks per item (`format.codecs.pick`); the items' changed elements into
    `changed`."""
    plans = []
    for s in scans:
        nk = (s.rows.shape[1] - 2) // 2
        changed[s.items] = s.rows[:, nk : 2 * nk].sum(1)
        codecs = np.array([pick(choice, int(changed[i]), int(numel[i])) for i in s.items], object)
        tables = {c: plan_table(s.rows[:, :nk], s.rows[:, nk : 2 * nk], c) for c in dict.fromkeys(codecs.tolist())}
        plans.append(_Plans(codecs, tables))
    return plans


def _record(it: EncodeItem, s_old: int, s_new: int, changed: int, plan, codec: str = registry.DEFAULT) -> TensorRecord:
    """An item's record (without chunks) as the CPU backend makes it, from its old and new
    digest word sums and its class plan (None: unchanged); `codec`: its sparse codec."""
    nbytes = it.new.numel() * it.info.nbytes
    rec = TensorRecord(
        name=it.name,
        dtype=it.info.name,
        shape=it.shape,
        codec=registry.SAME,
        digest=D.to_hex(D.finish(s_new & D.MASK64, nbytes)),
        base_digest=D.to_hex(D.finish(s_old & D.MASK64, nbytes)),
        changed=changed,
    )
    if changed:
        rec.codec, rec.classes, rec.inverted = codec, plan.runs, np.flatnonzero(plan.inverted).tolist()
    return rec


def _records(items: list[EncodeItem], scans: list[_Scan], plans: list[_Plans], changed: np.ndarray, out: list) -> None:
    """The records of the scans' items into `out`, but where `out` has one already (the CPU
    backend's, of a dense tensor)."""
    for s, p in zip(scans, plans):
        for j, (i, (s_old, s_new)) in enumerate(zip(s.items, s.rows[:, -2:].tolist())):
            if out[i] is None:
                plan = p.of(j) if changed[i] else None
                out[i] = _record(items[i], s_old, s_new, int(changed[i]), plan, p.codecs[j])
                if items[i].chunk_digests and changed[i]:
                    # a scan of items with chunk digests has their chunks' sums
                    _add_chunk_digests(out[i], items[i], cast("dict[int, np.ndarray]", s.chunks)[i])


def _add_chunk_digests(rec: TensorRecord, it: EncodeItem, chunks: np.ndarray) -> None:
    """A digest per chunk (its words numbered by their place in the walk: they add up to
    the record's) from its rows of `_Scan.chunks`, and the item's cuts, as the CPU backend
    writes them."""
    nbytes = (chunks[:, 0] * it.info.nbytes).tolist()
    rec.chunk_base_digests = [D.to_hex(D.finish(s & D.MASK64, n)) for s, n in zip(chunks[:, 1].tolist(), nbytes)]
    rec.chunk_digests = [D.to_hex(D.finish(s & D.MASK64, n)) for s, n in zip(chunks[:, 2].tolist(), nbytes)]
    if it.cuts is not None:
        rec.cuts = list(it.cuts)


def encode(
    items: list[EncodeItem],
    chunk_elems: int,
    level: int,
    threads: int | None,
    config: CudaCodecConfig = DEFAULT_CONFIG,
    pinned: bool = False,
    codec: str = registry.DEFAULT,
):
    """Records (chunk offsets into the concatenation of the returned parts), the payload as
    bytes-like parts (valid until this thread's next encode call) and `ready()`, which waits
    for the parts' copies from the device: call it before reading them (the pack's header
    can be made first, during the copy). Dense and snapshot
    tensors are coded by the CPU backend. With `pinned`, a payload that is one batch's alone
    (every changed tensor sparse and of one element type) is copied from the device into
    fresh pinned host memory with room for the pack's preamble and header before it, and is
    the one part (format.write_pack_into writes the pack around it) where the codec's
    encoder writes it there. `codec`: the codec of the sparse records, or the choice that
    picks one per record (`format.codecs.pick`; `sparse`: streams as `config` says)."""
    encoders = {c: registry.cuda_encoder(c) for c in picks(codec)}
    sparse_chunks.begin_encode()
    memory.begin_call()
    snap = any(it.old is None for it in items)
    if snap and not any(it.chunk_digests for it in items):  # a snapshot: raw byte planes, written on the device
        return snapshot.encode(items, chunk_elems, pinned, memory.pinned_empty if pinned else _pageable)
    if (
        snap or None in encoders.values()
    ):  # a snapshot's records per walk, or a codec the GPU does not write: on the host
        records, parts = _lay_out(*_on_cpu(items, chunk_elems, level, threads, codec))
        return records, parts, lambda: None
    numel = np.fromiter((it.new.numel() for it in items), np.int64, len(items))
    launched = [_launch_scan(items, w, chunk_elems) for w in _waves(numel)]
    changed = np.zeros(len(items), np.int64)
    records, parts, cpu_coded = [None] * len(items), [[] for _ in items], False
    by_type: dict[tuple[str, str], list] = {}  # per (element type, codec), each wave's (item indices, events)
    for w in launched:
        scans = _scans(w)
        plans = _plans(scans, changed, numel, codec)
        dense = changed > SPARSE_MAX_DENSITY * numel  # the wave's items, and those before it
        at = [i for s in scans for i in s.items if dense[i]]
        if at:
            for i, rec, ch in zip(at, *_on_cpu([items[i] for i in at], chunk_elems, level, threads, codec)):
                records[i], parts[i], cpu_coded = rec, ch, True
        for s, p in zip(scans, plans):
            coded = (changed[s.items] > 0) & ~dense[s.items]
            for c, table in p.tables.items():
                j = np.flatnonzero(coded & (p.codecs == c))
                if not len(j):
                    continue
                g = [s.items[k] for k in j.tolist()]
                b = sparse.Batch(
                    [items[i] for i in g],
                    table if len(j) == len(table) else table.take(j),
                    int(table.events[j].sum()),
                    int(changed[g].sum()),
                    _batch_hist(s, j),
                )
                by_type.setdefault((items[g[0]].info.name, c), []).append((g, sparse.events(b, chunk_elems)))
        _records(items, scans, plans, changed, records)  # while the device works on the events
    for i in np.flatnonzero(numel == 0).tolist():
        records[i] = _record(items[i], 0, 0, 0, None)
    in_room, copies = None, []
    for (_, c), waves in by_type.items():  # the sparse items of one element type and codec
        g = [i for g, _ in waves for i in g]
        ev = sparse.merge([ev for _, ev in waves])
        room = (
            prefix_bound(records, int(ev.first_chunk[-1])) if pinned and len(by_type) == 1 and not cpu_coded else None
        )
        done = cast(Callable, encoders[c])(ev, config, level, threads or os.cpu_count() or 1, room)
        if done.room is not None:
            in_room = done.payload.data
        copies.append(done.payload.copied)
        for i, part in zip(g, _tensor_parts(done, len(g))):
            parts[i] = part
    records, parts = _lay_out(records, parts)  # while the payloads are copied to the host

    def ready() -> None:
        for copied in copies:
            memory.wait(copied)

    return records, parts if in_room is None else [in_room], ready


@dataclass
class _Part:
    """A tensor's chunks in a batch's payload: their bytes, and per chunk its offset in the
    payload and length (lists: a header holds thousands of chunk references, a few per
    tensor, where numpy's cost per call outweighs its speed); their CRCs are the payload's from
    chunk `first` on, which may still be on their way."""

    view: memoryview
    start: int
    """The offset of the first chunk in the payload."""
    offsets: list
    lengths: list
    payload: sparse_chunks.Payload
    first: int


def _tensor_parts(done: sparse.Encoded, n: int) -> list[_Part]:
    """The parts of a batch's n tensors."""
    p = done.payload
    offsets, lengths = p.offsets.tolist(), p.lengths.tolist()
    data, out = memoryview(p.data), []  # type: ignore[arg-type]  # an ndarray is a buffer; its stubs say so from 3.12 only
    for a, b in zip(done.first_chunk[:n].tolist(), done.first_chunk[1 : n + 1].tolist()):
        start = offsets[a] if b > a else 0
        stop = offsets[b - 1] + lengths[b - 1] if b > a else 0
        out.append(_Part(data[start:stop], start, offsets[a:b], lengths[a:b], p, a))
    return out


def _lay_out(records: list[TensorRecord], parts: list):
    """Chunk references of every record, and the payload's parts in record order."""
    out, offset = [], 0
    for rec, ps in zip(records, parts):
        if isinstance(ps, _Part):
            shift = offset - ps.start
            crcs = ps.payload.crc_list[ps.first : ps.first + len(ps.offsets)]
            # plain tuples, made by zip: ChunkRef's constructor is Python and much slower,
            # and the header writes both the same
            rec.chunks = list(zip([o + shift for o in ps.offsets], ps.lengths, crcs))
            out.append(ps.view)
            offset += len(ps.view)
            continue
        for p in ps:
            rec.chunks.append(ChunkRef(offset, len(p), zlib.crc32(p)))
            out.append(p)
            offset += len(p)
    return records, out
