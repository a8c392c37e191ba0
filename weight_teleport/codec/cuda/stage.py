"""Staging a pack against live CUDA weights: decode and verify, write nothing.

Symbol streams are decoded on the CPU (zstd and the reference symbol kernels); events are
placed on the GPU (codec/cuda/sparse_decode.py). Dense chunks and snapshots, rare in a
delta stream, go through the CPU backend on a host copy of their tensors."""

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from weight_teleport.codec import digest as D
from weight_teleport.codec.cpu import backend as cpu
from weight_teleport.codec.cpu import chunks as C
from weight_teleport.codec.cuda import bitmap, ranks, sparse_decode
from weight_teleport.codec.cuda.digest import word_sum
from weight_teleport.codec.cuda.live import Live
from weight_teleport.codec.cuda.patch import DevicePatch, DeviceTensorPatch, FusedGroup
from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError
from weight_teleport.format import chunk_payload, read_groups

CORRUPT = "sparse chunk does not fit the receiver's weights (corrupt streams)"


def _chunk_events(data, info, inverted: np.ndarray, ncp: int):
    """Per-class event and residual counts ([ncp] each), event ranks and residuals of a chunk."""
    groups = read_groups(data)
    if len(groups) != inverted.size:
        raise PackFormatError(f"sparse chunk has {len(groups)} classes, its tensor {inverted.size}")
    parts = [C._class_streams(g, bool(inv), info) for g, inv in zip(groups, inverted)]
    ev, rc = np.zeros(ncp, np.int64), np.zeros(ncp, np.int64)
    ev[:inverted.size] = [p[0].size for p in parts]
    rc[:inverted.size] = [p[1].size for p in parts]
    rk = [np.cumsum(p[0] + 1) - 1 for p in parts]
    return ev, rc, np.concatenate(rk), np.concatenate([p[1] for p in parts])


class _Sparse:
    """One sparse tensor through the staging steps."""

    def __init__(self, live: Live, rec, header, pack, pool):
        self.live, self.rec, self.ce = live, rec, header.chunk_elems
        lut, inv = cpu._class_map(rec, live.info)
        self.inverted = inv
        self.ncp = ranks.pow2(inv.size + 1)
        dev = live.u.device
        self.lut = torch.from_numpy(lut).to(dev)
        self.inv = torch.from_numpy(inv.astype(np.int8)).to(dev)
        self.host = pool.map(lambda ref: _chunk_events(chunk_payload(pack, header, ref), live.info, inv,
                                                       self.ncp), rec.chunks)
        counts, _ = ranks.class_counts(live.u, None, self.lut, self.inv, live.info, self.ce)
        self.base, self.tot = ranks.block_bases(counts, len(rec.chunks))

    def place(self, tot: np.ndarray):
        """Check the streams against the class counts `tot`, then place the events."""
        ev, rc, rk, res = (list(x) for x in zip(*self.host))
        ev, rc = np.stack(ev), np.stack(rc)
        rk, res = np.concatenate(rk), np.concatenate(res)
        inv = np.zeros(self.ncp, bool)
        inv[:self.inverted.size] = self.inverted
        flat_ev = ev.ravel()
        has = flat_ev > 0
        last = np.full(flat_ev.size, -1, np.int64)
        last[has] = rk[(np.cumsum(flat_ev) - 1)[has]]
        if (ev > tot).any() or (last >= tot.ravel()).any() or (rc != np.where(inv, tot - ev, ev)).any():
            raise PackFormatError(CORRUPT)
        words = (tot.ravel() + 31) // 32
        seg = np.concatenate([[0], np.cumsum(words)[:-1]]).astype(np.int64)
        dev = self.live.u.device
        bits = torch.from_numpy(np.repeat(seg * 32, ev.ravel()) + rk).to(dev)
        bm, pref = bitmap.build(int(words.sum()), bits)
        res_off = np.concatenate([[0], np.cumsum(rc.ravel())[:-1]]).astype(np.int64)
        table = lambda a: torch.from_numpy(a.reshape(-1, self.ncp)).to(dev)
        res_d = torch.from_numpy(res.view(np.int64)).to(dev)
        self.pos, self.val, self.sums = sparse_decode.decode(
            self.live.u, self.lut, self.inv, self.base, table(seg), bm, pref, table(res_off), res_d,
            int(res.size), self.live.info, self.ce)


def _dense(lives: dict[str, Live], recs, header, pack, check_base: bool, threads) -> dict:
    """Dense and snapshot tensors through the CPU backend on host copies."""
    if not recs:
        return {}
    host = {r.name: cpu._Live(lives[r.name].tensor.detach().cpu(), lives[r.name].info) for r in recs}
    sub = dataclasses.replace(header, tensors=recs)
    staged = cpu.stage(host, sub, pack, check_base, threads)
    return {t.name: [(c.start, _upload(c.values, lives[t.name])) for c in t.chunks] for t in staged.tensors}


def _upload(values: np.ndarray, live: Live) -> torch.Tensor:
    signed = np.dtype(f"<i{live.info.nbytes}") if live.info.nbytes > 1 else np.dtype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(values).view(signed)).to(live.u.device)


def _verify(rec, nbytes: int, s_old: int, s_new: int, header, check_base: bool) -> None:
    if check_base and D.to_hex(D.finish(s_old, nbytes)) != rec.base_digest:
        raise PackMismatchError(
            f"tensor {rec.name!r} does not hold the weights of base version {header.base_version} "
            f"(digest {D.to_hex(D.finish(s_old, nbytes))}, expected {rec.base_digest}): the state is at "
            "another version or was modified; resync from a snapshot")
    predicted = D.finish(D.word_sum(D.from_hex(rec.base_digest), nbytes) + s_new - s_old, nbytes)
    if predicted != D.from_hex(rec.digest):
        raise DigestMismatchError(
            f"tensor {rec.name!r}: the patched weights would have digest {D.to_hex(predicted)}, "
            f"the pack promises {rec.digest}; the pack is corrupt or was encoded from other weights")


def stage(lives: dict[str, Live], header, pack, check_base: bool, threads: int | None) -> DevicePatch:
    """Decode and verify every chunk against the live weights; nothing is written."""
    delta = header.kind == "delta"
    sparse_recs = [r for r in header.tensors if r.codec == "sparse"]
    dense = _dense(lives, [r for r in header.tensors if r.codec not in ("sparse", "same")], header, pack,
                   check_base and delta, threads)
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        sparse = [_Sparse(lives[r.name], r, header, pack, pool) for r in sparse_recs]
        tots = torch.cat([s.tot.view(-1) for s in sparse]).cpu().numpy() if sparse else None
        at = 0
        for s in sparse:
            n = s.tot.numel()
            s.place(tots[at:at + n].reshape(s.tot.shape))
            at += n
    same = [r for r in header.tensors if r.codec == "same" and check_base and delta]
    sums = [s.sums for s in sparse] + [torch.stack([word_sum(lives[r.name].u)] * 2) for r in same]
    host = torch.stack(sums).cpu().tolist() if sums else []
    for rec, (s_old, s_new) in zip(sparse_recs + same, host):
        _verify(rec, rec.numel * lives[rec.name].info.nbytes, s_old, s_new, header, check_base and delta)
    tensors = []
    by_name = {s.rec.name: s for s in sparse}
    for rec in header.tensors:
        live = lives[rec.name]
        t = DeviceTensorPatch(rec.name, live.info, rec.shape, D.from_hex(rec.digest), dense=dense.get(rec.name, []))
        if rec.name in by_name:
            t.positions, t.values, t.changed = by_name[rec.name].pos, by_name[rec.name].val, rec.changed
        tensors.append(t)
    patch = DevicePatch(header.kind, header.version, header.base_version, tensors, check_base and delta)
    patch.groups = _fuse(lives, tensors)
    return patch


def _fuse(lives: dict[str, Live], tensors: list[DeviceTensorPatch]) -> list[FusedGroup]:
    """One group per element type of the sparse changes of tensors patched in place."""
    by_type: dict[torch.dtype, list[DeviceTensorPatch]] = {}
    for t in tensors:
        if t.positions is not None and lives[t.name].in_place:
            by_type.setdefault(t.info.int_torch, []).append(t)
    groups = []
    for members in by_type.values():
        ptrs = {t.name: lives[t.name].u.data_ptr() for t in members}
        base = min(ptrs, key=ptrs.get)
        size = members[0].info.nbytes
        offsets = torch.cat([t.positions + (ptrs[t.name] - ptrs[base]) // size for t in members])
        groups.append(FusedGroup(base, ptrs, offsets, torch.cat([t.values for t in members])))
        for t in members:
            t.positions = t.values = None
            t.fused = True
    return groups
