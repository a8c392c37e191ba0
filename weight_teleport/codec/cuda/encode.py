"""Encoding deltas of CUDA tensors: scans, class ranks and residuals on the GPU, the class
plan and the symbol streams on the CPU (the same code as the CPU backend, so the packs are
byte-identical to the CPU's). Snapshots and dense tensors go through the CPU backend."""

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from weight_teleport.codec import digest as D
from weight_teleport.codec.cpu import backend as cpu
from weight_teleport.codec.cpu import kernels as K
from weight_teleport.codec.cuda import ranks, sparse_encode
from weight_teleport.codec.cuda.live import EncodeItem
from weight_teleport.codec.cuda.scan import scan
from weight_teleport.codec.plan import SPARSE_MAX_DENSITY, plan_classes
from weight_teleport.codec.streams import encode_stream
from weight_teleport.format import ChunkRef, Group, Stream, TensorRecord, write_groups


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

    def chunk_jobs(self, level: int):
        """Per chunk, a function returning its bytes (ranks and residuals fetched to the host)."""
        rk, res = self.ranks.cpu().numpy(), self.res.cpu().numpy().view(np.uint64)
        e_off, r_off = _offsets(self.ev_cnt), _offsets(self.chg)
        return [lambda k=k: _chunk_bytes(rk, res, e_off[k], r_off[k], self.ev_cnt[k], self.chg[k],
                                         self.plan.inverted, self.it.info, level) for k in range(self.n_chunks)]


def _chunk_bytes(rk, res, e_off, r_off, ev, chg, inverted, info, level: int) -> bytes:
    """A sparse chunk from its classes' event ranks and residuals (as chunks.encode_sparse)."""
    groups = []
    wmask = np.uint64((1 << info.bits) - 1)
    for c in range(inverted.size):
        if ev[c] == 0 and chg[c] == 0:
            groups.append(Group(0, []))
            continue
        g = np.diff(rk[e_off[c]:e_off[c] + ev[c]].astype(np.int64), prepend=-1) - 1
        r = res[r_off[c]:r_off[c] + chg[c]]
        syms = np.empty(g.size, np.uint8)
        bits = np.empty(g.size * 4 + 8, np.uint8)
        rsyms = np.empty(max(g.size, r.size), np.uint8)
        esc = np.empty(rsyms.size, np.uint64)
        nbits, n_r, n_esc = K.class_to_symbols(g, r, not inverted[c], np.uint64(1 << (info.bits - 1)),
                                               wmask, syms, bits, rsyms, esc)
        streams = [syms, bits[:nbits], rsyms[:n_r], esc[:n_esc].astype(info.uint_numpy)]
        groups.append(Group(int(ev[c]), [Stream(*_coded(s, level)) for s in streams]))
    return write_groups(groups)


def _coded(data: np.ndarray, level: int):
    codec, payload = encode_stream(data, level)
    return codec, data.nbytes, payload


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


def encode(items: list[EncodeItem], chunk_elems: int, level: int, threads: int | None):
    """Records (chunk offsets relative to the returned chunk list) and chunk bytes."""
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
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        futures = [[pool.submit(job) for job in s.chunk_jobs(level)] for s in sparse]
        for i, fs in zip(todo, futures):
            parts[i] = [f.result() for f in fs]
    return _lay_out(records, parts)


def _lay_out(records: list[TensorRecord], parts: list[list[bytes]]):
    chunks, offset = [], 0
    for rec, ps in zip(records, parts):
        for p in ps:
            rec.chunks.append(ChunkRef(offset, len(p), zlib.crc32(p)))
            chunks.append(p)
            offset += len(p)
    return records, chunks
