"""Staging the `sparse_ac` tensors of one element type on the GPU.

The chunks' class tables (a few varints each) are read on the host in one compiled walk;
the chunks' bytes go to the device in one copy; a program per chunk range-decodes its
stream into the segments' event bitmaps and residuals (kernels/stage_adaptive.py); from
there the batch is a `SparseBatch`: the same checks against the live weights' class
counts, the same placement, digests and flags."""

import numpy as np
import torch
from numba import njit

from weight_teleport.codec.cuda.kernels import chunk_table, stage_adaptive, stage_bitmap, stage_place
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.stage.decode_streams import upload_range
from weight_teleport.codec.cuda.stage.sparse import SparseBatch
from weight_teleport.errors import PackFormatError
from weight_teleport.format.container import ChunkSpans
from weight_teleport.format.groups import MAX_VARINT


@njit(nogil=True, cache=True)
def _varint(pack, pos, end):
    """(value, next position), or (-1, pos) for a varint that runs past `end` or `MAX_VARINT`."""
    v, shift = 0, 0
    while pos < end and shift <= 63:
        b = np.int64(pack[pos])
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v, pos) if v <= MAX_VARINT else (-1, pos)
        shift += 7
    return -1, pos


@njit(nogil=True, cache=True)
def _tables(pack, starts, lengths, n_classes, inverted, elems, events, changes, coded):
    """Per chunk (its classes `n_classes`, `inverted` [chunks, ncp], `elems` elements):
    fills `events` and `changes` [chunks, ncp] and `coded` (where its stream starts).
    Returns the first chunk whose table breaks the format's rules, or -1."""
    for c in range(starts.size):
        pos, end = starts[c], starts[c] + lengths[c]
        k, pos = _varint(pack, pos, end)
        if k != n_classes[c]:
            return c
        ev_sum, ch_sum = 0, 0
        for j in range(k):
            e, pos = _varint(pack, pos, end)
            if e < 0:
                return c
            ch = e
            if inverted[c, j]:
                ch, pos = _varint(pack, pos, end)
                if ch < 0:
                    return c
            events[c, j], changes[c, j] = e, ch
            ev_sum += e
            ch_sum += ch
        if ev_sum > elems[c] or ch_sum > elems[c]:
            return c
        coded[c] = pos
    return -1


class AdaptiveBatch(SparseBatch):
    """A `SparseBatch` of `sparse_ac` records: `decompress` reads the class tables and
    copies the chunks to the device, `decode` launches the range decoder and the rest."""

    def decompress(self, pack, spans: ChunkSpans, threads: int | None = None, upload=None) -> None:
        """Reads the chunks' class tables (`spans`: the batch's chunks in the pack, in order)
        and queues their bytes' copy to the device; `threads` and `upload` are unused (a
        `sparse` batch's)."""
        n, ncp = self.table.chunks, self.ncp
        events = np.zeros((n, ncp), np.int64)
        changes = np.zeros((n, ncp), np.int64)
        coded = np.zeros(n, np.int64)
        inv = self._inv_tensors[self.table.host[:, chunk_table.TENSOR]] != 0
        k = self.n_classes[self.table.host[:, chunk_table.TENSOR]]
        u8 = np.frombuffer(pack, np.uint8)
        bad = _tables(u8, spans.starts, spans.lengths, k, inv, self.table.host[:, chunk_table.LEN], events, changes,
                      coded)
        if bad >= 0:
            rec = self.recs[int(self.table.host[bad, chunk_table.TENSOR])]
            raise PackFormatError(f"tensor {rec.name!r}: a sparse_ac chunk's class table is one its chunk cannot have")
        lo, hi = spans.bounds()
        buf = upload_range(pack, lo, hi, self.table.base.device, memory.pinned(pack))
        self.events, self.res_cnt, self.inverted = events.reshape(-1), changes.reshape(-1), inv.reshape(-1)
        self._coded = (buf, coded - lo, spans.starts + spans.lengths - lo)

    def decode(self) -> None:
        buf, starts, ends = self._coded
        dev = self.table.base.device
        n_res = int(self.res_cnt.sum())
        ev, res_cnt, inv, st, en, res_off = memory.to_device(
            [self.events, self.res_cnt, self.inverted, starts, ends, memory.starts(self.res_cnt)], dev)
        inv = inv != 0
        tot = self.tot.view(-1)
        seg_word = memory.starts((tot + 31) // 32)
        words, self.bitmap = self.bitmap, None
        dec = stage_adaptive.decode(buf, st, en, ev, res_cnt, inv, seg_word, words, n_res, self.info.bits, self.ncp)
        unfit = (ev > tot).any() | (inv & (res_cnt != tot - ev)).any() | ((ev > 0) & (dec.last_rank >= tot)).any()
        self.pos, self.val, sums = stage_place.decode(
            self.table, self.luts, self.inv, int(self.n_classes.max()), self.counts, self.base, seg_word, dec.bitmap,
            stage_bitmap.prefix(dec.bitmap), res_off, dec.residuals, self.info, self.old_sums)
        self.sums = self.table.per_tensor(sums)
        self.flags = torch.stack([torch.zeros((), dtype=torch.bool, device=dev), dec.malformed, unfit])
