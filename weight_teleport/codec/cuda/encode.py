"""Encoding deltas of CUDA tensors, batched per element type: one scan launch over every
chunk (histograms and digests, read back in one transfer), the class plans on the CPU (the
CPU backend's code), then per element type one launch each of the class-count and events
kernels (the tensors' records are made on the host while the first batch's kernels run),
symbol and stream coding of all segments, and the payload gathered on the GPU
(codec/cuda/encode_batch.py). Snapshots and dense tensors go through the CPU backend."""

import os
import zlib

import numpy as np
import torch

from weight_teleport.codec import digest as D
from weight_teleport.codec.cpu import backend as cpu
from weight_teleport.codec.cuda import blocks, chunk_bytes, encode_batch, layout
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.live import EncodeItem, flat_bits, grouped
from weight_teleport.codec.cuda.scan import SPAN, aligned, scan
from weight_teleport.codec.plan import SPARSE_MAX_DENSITY, plan_many
from weight_teleport.format import ChunkRef, TensorRecord, prefix_bound

DEFAULT_CONFIG = CudaCodecConfig()


def _host_item(it: EncodeItem) -> cpu.EncodeItem:
    to_np = lambda t: flat_bits(t, it.info).cpu().numpy().view(it.info.uint_numpy)
    return cpu.EncodeItem(it.name, it.info, it.shape, to_np(it.new), None if it.old is None else to_np(it.old))


def _on_cpu(items: list[EncodeItem], chunk_elems: int, level: int, threads):
    """(records, per-record chunk lists) through the CPU backend."""
    records, chunks = cpu.encode([_host_item(it) for it in items], chunk_elems, level, threads)
    parts, at = [], 0
    for rec in records:
        parts.append(chunks[at:at + len(rec.chunks)])
        at += len(rec.chunks)
        rec.chunks = []
    return records, parts


def _by_type(items: list[EncodeItem], which) -> list[list[int]]:
    """Indices of `which` items grouped by dtype, in item order within a group."""
    return grouped(which, lambda i: items[i].info.name)


def _scan_rows(items: list[EncodeItem], chunk_elems: int) -> tuple[list[np.ndarray], list]:
    """Per item its scan row (key counts, changed key counts, old and new word sums) and
    where the per-block histograms of its programs are (its group's histograms on the
    device, its first program there, its programs), all dtypes launched before the one
    transfer."""
    groups = _by_type(items, [i for i, it in enumerate(items) if it.new.numel()])
    outs, hists = [], [None] * len(items)
    for g in groups:
        olds, news = [aligned(items[i].old) for i in g], [aligned(items[i].new) for i in g]  # alive until launched
        info = items[g[0]].info
        table = blocks.build_cached(olds, chunk_elems, SPAN, info)
        done = scan(table, blocks.pair(news, table, info), info)
        outs.append(done.rows)
        per = np.bincount(table.host[:, blocks.TENSOR], -(-table.host[:, blocks.LEN] // SPAN), len(g)).astype(np.int64)
        for i, p0, n in zip(g, layout.starts(per).tolist(), per.tolist()):
            hists[i] = done.hist, p0, n
    flat = torch.cat([o.view(-1) for o in outs]).cpu().numpy() if outs else np.zeros(0, np.int64)
    rows, at = [None] * len(items), 0
    for g, o in zip(groups, outs):
        for i, row in zip(g, flat[at:at + o.numel()].reshape(o.shape)):
            rows[i] = row
        at += o.numel()
    for i, it in enumerate(items):
        if rows[i] is None:
            rows[i] = np.zeros(2 * (1 << it.info.exponent_bits) + 2, np.int64)
    return rows, hists


def _batch_hist(hists: list, g: list[int]) -> torch.Tensor:
    """The scan's histograms of the items g (of one scan group, in its order), one after the
    other: the group's own where g is all of it (no copy), else its runs of consecutive rows
    concatenated (a few runs: the items left out are the unchanged and dense ones)."""
    hist, spans = hists[g[0]][0], []
    for i in g:
        _, first, n = hists[i]
        if spans and spans[-1][1] == first:
            spans[-1][1] = first + n
        else:
            spans.append([first, first + n])
    if spans == [[0, hist.shape[0]]]:
        return hist
    return torch.cat([hist[a:b] for a, b in spans])


def _plans(items: list[EncodeItem], rows: list[np.ndarray]) -> tuple[np.ndarray, list]:
    """(changed elements of each item, its class plan or None where none changed) from the
    scan rows, as the CPU backend makes them: the rows of all tensors with one key count read
    as one table, and the plans of the changed ones made in one compiled walk."""
    changed, plans = np.zeros(len(items), np.int64), [None] * len(items)
    for same_keys in grouped(range(len(items)), lambda i: items[i].info.exponent_bits):
        nk = 1 << items[same_keys[0]].info.exponent_bits
        table = np.stack([rows[i] for i in same_keys])
        n = table[:, nk:2 * nk].sum(1)
        changed[same_keys] = n
        moving = np.flatnonzero(n)
        for k, plan in zip(moving.tolist(), plan_many(table[moving, :nk], table[moving, nk:2 * nk])):
            plans[same_keys[k]] = plan
    return changed, plans


def _records(items: list[EncodeItem], rows: list[np.ndarray], changed: np.ndarray, plans: list) -> list[TensorRecord]:
    """The items' records (without chunks), as the CPU backend makes them."""
    records = []
    for it, row, n, plan in zip(items, rows, changed.tolist(), plans):
        nbytes = it.new.numel() * it.info.nbytes
        s_old, s_new = row[-2:].tolist()
        rec = TensorRecord(name=it.name, dtype=it.info.name, shape=it.shape, codec="same",
                           digest=D.to_hex(D.finish(s_new & D.MASK64, nbytes)),
                           base_digest=D.to_hex(D.finish(s_old & D.MASK64, nbytes)), changed=n)
        if plan is not None:
            rec.codec, rec.classes, rec.inverted = "sparse", plan.runs, np.flatnonzero(plan.inverted).tolist()
        records.append(rec)
    return records


def encode(items: list[EncodeItem], chunk_elems: int, level: int, threads: int | None,
           config: CudaCodecConfig = DEFAULT_CONFIG, pinned: bool = False):
    """Records (chunk offsets into the concatenation of the returned parts) and the payload
    as bytes-like parts (valid until this thread's next encode call). Dense and snapshot
    tensors are coded by the CPU backend. With `pinned`, a payload that is one batch's alone
    (every changed tensor sparse and of one element type) is copied from the device into
    fresh pinned host memory with room for the pack's preamble and header before it, and is
    the one part (format.write_pack_into writes the pack around it)."""
    chunk_bytes.begin_encode()
    layout.begin_call()
    if any(it.old is None for it in items):
        return _lay_out(*_on_cpu(items, chunk_elems, level, threads))
    rows, hists = _scan_rows(items, chunk_elems)
    changed, plans = _plans(items, rows)
    parts: list = [[] for _ in items]
    numel = np.fromiter((it.new.numel() for it in items), np.int64, len(items))
    dense = np.flatnonzero(changed > SPARSE_MAX_DENSITY * numel).tolist()
    on_cpu = {}
    if dense:
        for i, rec, ch in zip(dense, *_on_cpu([items[i] for i in dense], chunk_elems, level, threads)):
            on_cpu[i], parts[i] = rec, ch
    sparse = [i for i, p in enumerate(plans) if p is not None and i not in on_cpu]
    records, groups, room, copies = None, _by_type(items, sparse), None, []
    for g in groups:
        b = encode_batch.Batch([items[i] for i in g], [plans[i] for i in g], sum(plans[i].events for i in g),
                               int(changed[g].sum()), _batch_hist(hists, g))
        ev = encode_batch.events(b, chunk_elems)
        records = records or _records(items, rows, changed, plans)  # while the device works on the first batch
        if pinned and len(groups) == 1 and not on_cpu:
            room = prefix_bound(records, int(ev.first_chunk[-1]))
        done = encode_batch.encode(ev, config, level, threads or os.cpu_count() or 1, room)
        copies.append(done.payload.copied)
        for j, i in enumerate(g):
            parts[i] = _tensor_part(done, j)
    records = records or _records(items, rows, changed, plans)
    for i, rec in on_cpu.items():
        records[i] = rec
    records, parts = _lay_out(records, parts)  # while the payloads are copied to the host
    for copied in copies:
        if copied is not None:
            copied.synchronize()
    return records, parts if room is None else [done.payload.data]


def _tensor_part(done: encode_batch.Encoded, j: int):
    """(memoryview of tensor j's chunks, their offsets from its first byte, lengths, CRCs)."""
    p, a, b = done.payload, done.first_chunk[j], done.first_chunk[j + 1]
    start = int(p.offsets[a]) if b > a else 0
    stop = int(p.offsets[b - 1] + p.lengths[b - 1]) if b > a else 0
    return memoryview(p.data)[start:stop], p.offsets[a:b] - start, p.lengths[a:b], p.crcs[a:b]


def _lay_out(records: list[TensorRecord], parts: list):
    """Chunk references of every record, and the payload's parts in record order."""
    out, offset = [], 0
    for rec, ps in zip(records, parts):
        if isinstance(ps, tuple):
            view, offs, lens, crcs = ps
            rec.chunks = list(map(ChunkRef, (offs + offset).tolist(), lens.tolist(), crcs.tolist()))
            out.append(view)
            offset += len(view)
            continue
        for p in ps:
            rec.chunks.append(ChunkRef(offset, len(p), zlib.crc32(p)))
            out.append(p)
            offset += len(p)
    return records, out
