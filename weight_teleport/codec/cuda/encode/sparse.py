"""The sparse tensors of one element type encoded as one batch: a chunk table over all
their chunks, their class counts per block (from the scan's histograms with the warp
kernels, else one class-count launch), one launch of the events kernel (the batches of a
state scanned in two waves are merged after it: `merge`), symbol coding of every (chunk,
class) segment, stream coding and the payload (codec/cuda/encode/sparse_chunks.py)."""

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from weight_teleport.codec.cuda.encode import sparse_chunks
from weight_teleport.codec.cuda.kernels import (
    chunk_table,
    class_ranks,
    encode_events,
    encode_scan,
    encode_symbols,
    warp,
)
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.items import EncodeItem
from weight_teleport.codec.plan import PlanTable


@dataclass
class Batch:
    """The tensors of one batch, their class plans and their event and change totals."""

    items: list[EncodeItem]
    plans: PlanTable
    n_events: int
    n_changed: int
    hist: torch.Tensor
    """The scan's per-block histograms of the batch's tensors, one after the other."""


@dataclass
class Encoded:
    """A batch's chunks on the host, tensor after tensor (what every sparse codec's CUDA
    encoder returns)."""

    payload: sparse_chunks.Payload
    first_chunk: np.ndarray
    """Index of each tensor's first chunk, then the number of chunks."""
    room: int | None = None
    """Where set, the payload lies this many bytes into fresh pinned memory, the room for
    the pack's preamble and header (`format.write_pack_into`)."""


def _class_tables(plans: PlanTable, dev) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, int]:
    """(class maps [tensors, keys] uint8, inverted flags [tensors, NCP] int8, classes, NCP)."""
    ncp = class_ranks.pow2(int(plans.n_classes.max()))
    inv = plans.inverted[:, :ncp].view(np.int8)
    return memory.upload(plans.lut, dev), memory.upload(inv, dev), plans.n_classes, ncp


@dataclass
class Events:
    """A batch's events and residuals, launched on the device and not yet waited for."""

    ranks: list[torch.Tensor]
    residuals: list[torch.Tensor]
    """The ranks and residuals of each piece of the segments (one: `merge` makes more)."""
    segments: encode_symbols.Segments
    ncp: int
    """Class slots of a chunk: its segments."""
    n_groups: np.ndarray
    """Classes of every chunk's tensor."""
    first_chunk: np.ndarray
    """Index of each tensor's first chunk, then the number of chunks."""


def events(b: Batch, chunk_elems: int) -> Events:
    """Launch the class counts and the events kernel of every chunk of the batch (no host
    sync: the caller's host work overlaps them)."""
    olds = cast("list[torch.Tensor]", [it.old for it in b.items])  # a delta's items have their base
    info, dev = b.items[0].info, olds[0].device
    luts, inv, k, ncp = _class_tables(b.plans, dev)
    fast = warp.available(olds[0])  # the scan's blocks, their class counts from its histograms
    cuts = [it.cuts for it in b.items]
    table = chunk_table.build_cached(
        olds, chunk_elems, encode_scan.SPAN if fast else class_ranks.BLOCK, info, cuts if any(cuts) else None
    )
    new = chunk_table.pair([it.new for it in b.items], table, info)
    if fast:
        counts, evc = warp.hist_counts(b.hist, table, luts, inv, info, ncp)
    else:
        counts, evc = class_ranks.table_counts(table, luts, info, ncp, int(k.max()), new, inv)
    rbase, tot = class_ranks.table_bases(counts, table)
    ebase, ev = class_ranks.table_bases(evc, table)
    inv_rows = inv[table.rows[:, chunk_table.TENSOR]] != 0
    chg = torch.where(inv_rows, tot - ev, ev).view(-1)
    ev = ev.view(-1)
    rk, res = encode_events.events(
        table,
        new,
        luts,
        inv,
        rbase,
        ebase,
        memory.starts(ev),
        memory.starts(chg),
        b.n_events,
        b.n_changed,
        int(k.max()),
        info,
    )
    n_chunks = np.bincount(table.host[:, chunk_table.TENSOR], minlength=len(b.items)).astype(np.int64)
    return Events(
        [rk],
        [res],
        encode_symbols.Segments(ev, chg, inv_rows.view(-1), info.bits),
        ncp,
        k[table.host[:, chunk_table.TENSOR]],
        np.concatenate([[0], np.cumsum(n_chunks)]),
    )


def merge(parts: list[Events]) -> Events:
    """The events of batches of one element type, launched one after the other, as one
    batch's: their segments end to end, each batch's chunks padded with empty segments to
    the most class slots of any; their ranks and residuals stay where each batch's kernel
    wrote them, a piece per batch."""
    if len(parts) == 1:
        return parts[0]
    ncp = max(e.ncp for e in parts)

    def padded(which: str) -> torch.Tensor:
        out = []
        for e in parts:
            t = getattr(e.segments, which).view(-1, e.ncp)
            out.append(torch.cat([t, t.new_zeros((t.shape[0], ncp - e.ncp))], 1) if e.ncp < ncp else t)
        return torch.cat(out).view(-1)

    starts = memory.starts(np.array([e.first_chunk[-1] for e in parts]))
    first = np.concatenate(
        [*(e.first_chunk[:-1] + at for e, at in zip(parts, starts)), [starts[-1] + parts[-1].first_chunk[-1]]]
    )
    segments = encode_symbols.Segments(
        padded("ev_cnt"),
        padded("res_cnt"),
        padded("inverted"),
        parts[0].segments.bits,
        tuple(int(e.first_chunk[-1]) * ncp for e in parts),
    )
    return Events(
        [r for e in parts for r in e.ranks],
        [x for e in parts for x in e.residuals],
        segments,
        ncp,
        np.concatenate([e.n_groups for e in parts]),
        first,
    )


def encode(ev: Events, cfg: CudaCodecConfig, level: int, threads: int, room: int | None = None) -> Encoded:
    """The `sparse` chunks of every tensor of the batch whose events `ev` are (host waits:
    the symbol streams' total, the chunks' lengths and CRCs; the payload's copy is queued,
    into fresh pinned memory `room` bytes past its start when given: sparse_chunks.assemble)."""
    st = encode_symbols.encode(ev.ranks, ev.residuals, ev.segments)
    payload = sparse_chunks.assemble(st, sparse_chunks.code(st, cfg, level, threads), ev.n_groups, room)
    return Encoded(payload, ev.first_chunk, room)
