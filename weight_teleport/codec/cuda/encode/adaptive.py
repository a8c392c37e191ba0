"""`sparse_ac` chunks of one batch from the GPU's events: the range coder writes every
chunk's coded stream on the device (kernels/encode_adaptive.py); the host waits for their
lengths, copies the streams and puts each chunk's class table before its stream, then takes
the chunks' CRC-32s. The chunks are byte-identical to the CPU backend's."""

import os
from typing import cast

import numpy as np
import torch
from numba import njit

from weight_teleport.codec.cuda.encode import sparse
from weight_teleport.codec.cuda.encode.sparse_chunks import Payload
from weight_teleport.codec.cuda.kernels import encode_adaptive
from weight_teleport.codec.sparse_ac import write_table
from weight_teleport.format.container import crc32_ranges

ROOM_BASE, ROOM_EVENT, ROOM_CHANGE = 64, 3, 2
"""A chunk's first room for its stream: bytes, plus bytes per event and per change (a
weight-like chunk takes about 1-1.5 bytes a change; one that needs more is coded again)."""


@njit(nogil=True, cache=True)
def _lay_out(coded, room_at, coded_len, ev_cnt, res_cnt, inverted, n_groups, ncp, out, offsets, lengths):
    """Every chunk (its class table, then its coded stream) back to back into `out`; returns
    the bytes written. Chunk c's segments are rows c * ncp ... of the segment tables."""
    at = 0
    for c in range(n_groups.size):
        offsets[c] = at
        s = c * ncp
        at = write_table(out, at, n_groups[c], ev_cnt[s : s + ncp], res_cnt[s : s + ncp], inverted[s : s + ncp])
        out[at : at + coded_len[c]] = coded[room_at[c] : room_at[c] + coded_len[c]]
        at += coded_len[c]
        lengths[c] = at - offsets[c]
    return at


def encode(
    ev: sparse.Events, cfg=None, level: int = 0, threads: int | None = None, room: int | None = None
) -> sparse.Encoded:
    """The `sparse_ac` chunks of every tensor of the batch whose events `ev` are, laid out
    on the host (a sparse codec's CUDA encoder: `cfg`, `level`, `threads` and `room` serve
    the stream coding of `sparse` and are not used)."""
    seg = ev.segments
    # the events kernels leave the segment tables on the device
    seg_ev_cnt, seg_res_cnt = cast(torch.Tensor, seg.ev_cnt), cast(torch.Tensor, seg.res_cnt)
    seg_inverted = cast(torch.Tensor, seg.inverted)
    ranks = ev.ranks[0] if len(ev.ranks) == 1 else torch.cat(ev.ranks)
    residuals = ev.residuals[0] if len(ev.residuals) == 1 else torch.cat(ev.residuals)
    n_chunks = int(ev.first_chunk[-1])
    host = torch.stack([seg_ev_cnt.long(), seg_res_cnt.long(), seg_inverted.long()]).cpu().numpy()
    ev_cnt, res_cnt, inverted = host[0], host[1], host[2] != 0
    per_chunk = (ROOM_EVENT * ev_cnt + ROOM_CHANGE * res_cnt).reshape(n_chunks, ev.ncp).sum(1) + ROOM_BASE
    chunk_room = torch.from_numpy(per_chunk).to(ranks.device)
    buf, room_at_d, coded_len_d = encode_adaptive.encode(
        ranks, residuals, seg_ev_cnt, seg_res_cnt, seg_inverted, ev.ncp, seg.bits, chunk_room
    )
    coded_len = coded_len_d.cpu().numpy()
    room_at = room_at_d.cpu().numpy()
    coded = buf.cpu().numpy()
    table_bound = 10 * (1 + 2 * ev.n_groups.astype(np.int64))
    out = np.empty(int(coded_len.sum() + table_bound.sum()), np.uint8)
    offsets = np.empty(n_chunks, np.int64)
    lengths = np.empty(n_chunks, np.int64)
    size = _lay_out(
        coded,
        room_at,
        coded_len,
        ev_cnt,
        res_cnt,
        inverted,
        ev.n_groups.astype(np.int64),
        ev.ncp,
        out,
        offsets,
        lengths,
    )
    data = out[:size]
    crcs = np.array(crc32_ranges(data, offsets, lengths, os.cpu_count() or 1), np.int64)
    return sparse.Encoded(Payload(data, offsets, lengths, crcs, None, None), ev.first_chunk)
