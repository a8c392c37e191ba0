"""Encoding deltas of CUDA tensors: scans, class ranks, residuals and symbol streams on the
GPU, the class plan on the CPU (the CPU backend's code), stream coding with nvCOMP (or the
CPU's zstd). Snapshots and dense tensors go through the CPU backend."""

import os
import zlib

import numpy as np
import torch

from weight_teleport.codec import digest as D
from weight_teleport.codec.cpu import backend as cpu
from weight_teleport.codec.cuda import chunk_bytes, ranks, sparse_encode, symbols
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.live import EncodeItem
from weight_teleport.codec.cuda.scan import scan
from weight_teleport.codec.plan import SPARSE_MAX_DENSITY, plan_classes
from weight_teleport.format import ChunkRef, TensorRecord

DEFAULT_CONFIG = CudaCodecConfig()


def _host_item(it: EncodeItem) -> cpu.EncodeItem:
    to_np = lambda t: t.cpu().numpy().view(it.info.uint_numpy)
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


def _record(it: EncodeItem, row: np.ndarray):
    """(record, class plan or None) from a scan row, as the CPU backend makes them."""
    nk = 1 << it.info.exponent_bits
    total, changed = row[:nk], row[nk:2 * nk]
    s_old, s_new = int(row[-2]) & D.MASK64, int(row[-1]) & D.MASK64
    nbytes = it.new.numel() * it.info.nbytes
    rec = TensorRecord(name=it.name, dtype=it.info.name, shape=it.shape, codec="same",
                       digest=D.to_hex(D.finish(s_new, nbytes)), base_digest=D.to_hex(D.finish(s_old, nbytes)),
                       changed=int(changed.sum()))
    if rec.changed == 0:
        return rec, None
    plan = plan_classes(total, changed)
    rec.codec, rec.classes = "sparse", plan.runs
    rec.inverted = [int(c) for c in np.flatnonzero(plan.inverted)]
    return rec, plan


def _offsets(a: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(a.ravel())[:-1]]).astype(np.int64).reshape(a.shape)


class _Sparse:
    """One tensor through the GPU steps of sparse encoding."""

    def __init__(self, it: EncodeItem, plan, chunk_elems: int):
        self.it, self.plan, self.ce = it, plan, chunk_elems
        dev = it.new.device
        self.lut = torch.from_numpy(plan.lut).to(dev)
        self.inv = torch.from_numpy(plan.inverted.astype(np.int8)).to(dev)
        self.n_chunks = -(-it.new.numel() // chunk_elems)
        counts, events = ranks.class_counts(it.old, it.new, self.lut, self.inv, it.info, chunk_elems)
        self.rbase, self.tot = ranks.block_bases(counts, self.n_chunks)
        self.ebase, self.ev = ranks.block_bases(events, self.n_chunks)

    def run(self, tot: np.ndarray, ev: np.ndarray):
        """Launch the event kernel, given the class totals and event counts on the host."""
        inv = np.zeros(tot.shape[1], bool)
        inv[:self.plan.n_classes] = self.plan.inverted
        self.ev_cnt, self.chg = ev, np.where(inv, tot - ev, ev)
        dev = self.it.new.device
        self.ranks, self.res = sparse_encode.events(
            self.it.old, self.it.new, self.lut, self.inv, self.rbase, self.ebase,
            torch.from_numpy(_offsets(ev)).to(dev), torch.from_numpy(_offsets(self.chg)).to(dev),
            int(ev.sum()), int(self.chg.sum()), self.it.info, self.ce)

    def segments(self) -> symbols.Segments:
        """The (chunk, class) segments of this tensor, in the order of its ranks and residuals."""
        ncp = self.ev_cnt.shape[1]
        inv = np.zeros(ncp, bool)
        inv[:self.plan.n_classes] = self.plan.inverted
        return symbols.Segments(self.ev_cnt.ravel().astype(np.int64), self.chg.ravel().astype(np.int64),
                                np.tile(inv, self.n_chunks), self.it.info.bits)


def _sparse_chunks(sparse: list[_Sparse], cfg: CudaCodecConfig, level: int, threads) -> list[list[bytes]]:
    """Chunk bytes of every sparse tensor: symbols per element width in one batch each."""
    parts: list[list[bytes]] = [[] for _ in sparse]
    for bits in sorted({s.it.info.bits for s in sparse}):
        idx = [i for i, s in enumerate(sparse) if s.it.info.bits == bits]
        segs = [sparse[i].segments() for i in idx]
        seg = symbols.Segments(*(np.concatenate([getattr(g, f) for g in segs]) for f in
                                 ("ev_cnt", "res_cnt", "inverted")), bits)
        st = symbols.encode(torch.cat([sparse[i].ranks for i in idx]), torch.cat([sparse[i].res for i in idx]), seg)
        coded = chunk_bytes.coded_streams(st, cfg, level, threads)
        first = 0
        for i, g in zip(idx, segs):
            s = sparse[i]
            parts[i] = chunk_bytes.chunks_of(coded, first, s.ev_cnt, s.chg, s.plan.n_classes, st.lengths)
            first += g.ev_cnt.size
    return parts


def _host_tables(sparse: list[_Sparse]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(class totals, event counts) per tensor, fetched in one transfer."""
    if not sparse:
        return []
    flat = torch.cat([torch.cat([s.tot.view(-1), s.ev.view(-1)]) for s in sparse]).cpu().numpy()
    out, at = [], 0
    for s in sparse:
        n = s.tot.numel()
        out.append((flat[at:at + n].reshape(s.tot.shape), flat[at + n:at + 2 * n].reshape(s.tot.shape)))
        at += 2 * n
    return out


def encode(items: list[EncodeItem], chunk_elems: int, level: int, threads: int | None,
           config: CudaCodecConfig = DEFAULT_CONFIG):
    """Records (chunk offsets relative to the returned chunk list) and chunk bytes. Dense
    and snapshot tensors are coded by the CPU backend (portable zstd streams)."""
    if any(it.old is None for it in items):
        records, parts = _on_cpu(items, chunk_elems, level, threads)
        return _lay_out(records, parts)
    scans = [scan(it.old, it.new, it.info) for it in items]
    flat = torch.cat(scans).cpu().numpy() if scans else np.zeros(0, np.int64)
    bounds = np.cumsum([0] + [s.numel() for s in scans])
    rows = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    records, plans, fallback = [], [], []
    for it, row in zip(items, rows):
        rec, plan = _record(it, row)
        if rec.changed > SPARSE_MAX_DENSITY * it.new.numel():
            fallback.append(len(records))
        records.append(rec)
        plans.append(plan)
    parts: list[list[bytes]] = [[] for _ in items]
    if fallback:
        recs, chunks = _on_cpu([items[i] for i in fallback], chunk_elems, level, threads)
        for i, rec, ch in zip(fallback, recs, chunks):
            records[i], parts[i] = rec, ch
    todo = [i for i, r in enumerate(records) if r.codec == "sparse" and i not in fallback]
    sparse = [_Sparse(items[i], plans[i], chunk_elems) for i in todo]
    for s, (tot, ev) in zip(sparse, _host_tables(sparse)):
        s.run(tot, ev)
    for i, ps in zip(todo, _sparse_chunks(sparse, config, level, threads or os.cpu_count() or 1)):
        parts[i] = ps
    return _lay_out(records, parts)


def _lay_out(records: list[TensorRecord], parts: list[list[bytes]]):
    chunks, offset = [], 0
    for rec, ps in zip(records, parts):
        for p in ps:
            rec.chunks.append(ChunkRef(offset, len(p), zlib.crc32(p)))
            chunks.append(p)
            offset += len(p)
    return records, chunks
