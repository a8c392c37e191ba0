"""Staging the `sparse_ac` tensors on the GPU (`AdaptiveStage`, the codec's stager that
the registry names), a batch per element type.

The chunks' class tables (a few varints each) are read on the host in one compiled walk;
the chunks' bytes go to the device in one copy; a program per chunk range-decodes its
stream into the segments' event bitmaps and residuals (kernels/stage_adaptive.py); from
there the batch is a `SparseBatch`: the same checks against the live weights' class
counts, the same placement, digests and flags."""

import os
from typing import cast

import numpy as np
import torch

from weight_teleport.codec.cuda.kernels import chunk_table, stage_adaptive
from weight_teleport.codec.cuda.live import grouped
from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.stage.decode_streams import upload_range
from weight_teleport.codec.cuda.stage.sparse import SparseBatch
from weight_teleport.codec.plan import class_maps, run_arrays
from weight_teleport.codec.sparse_ac import read_tables
from weight_teleport.errors import PackFormatError
from weight_teleport.format.container import ChunkSpans, crc32_ranges


class AdaptiveBatch(SparseBatch):
    """A `SparseBatch` of `sparse_ac` records: `decompress` reads the class tables and
    copies the chunks to the device, `decode` launches the range decoder and the rest."""

    # the stager hands each codec's batch what it reads: here the chunks' spans
    def decompress(  # type: ignore[override]
        self,
        pack,
        spans: ChunkSpans,
        threads: int | None = None,
        upload=None,
    ) -> None:
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
        bad = read_tables(
            u8, spans.starts, spans.lengths, k, inv, self.table.host[:, chunk_table.LEN], events, changes, coded
        )
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
            [self.events, self.res_cnt, self.inverted, starts, ends, memory.starts(self.res_cnt)], dev
        )
        inv = inv != 0
        tot = self.tot.view(-1)
        seg_word = memory.starts((tot + 31) // 32)
        words, self.bitmap = cast(torch.Tensor, self.bitmap), None
        dec = stage_adaptive.decode(buf, st, en, ev, res_cnt, inv, seg_word, words, n_res, self.info.bits, self.ncp)
        self.place(dec, ev, res_cnt, inv, res_off, seg_word, torch.zeros((), dtype=torch.bool, device=dev))


class AdaptiveStage:
    """The `sparse_ac` records' stager (codec/cuda/stage/staging.py says what a stager
    does): a batch per element type, launched after the `sparse` batches; their chunks'
    CRC-32s are checked on the host first, and their bytes go to the device in one copy per
    batch (not overlapped with the class counts, as the `sparse` batches' are)."""

    crcs = None

    def __init__(self, lives: dict, recs: list, header, pack, threads: int | None, config=None):
        self.lives, self.recs, self.header, self.pack, self.threads = lives, recs, header, pack, threads

    def launch(self) -> list[AdaptiveBatch]:
        out = []
        for rs in grouped(self.recs, lambda r: self.lives[r.name].info.name):
            spans = ChunkSpans.of(self.header, rs)
            spans.compare(crc32_ranges(self.pack, spans.starts, spans.lengths, self.threads or os.cpu_count() or 1))
            info = self.lives[rs[0].name].info
            b = AdaptiveBatch(
                [self.lives[r.name] for r in rs],
                rs,
                self.header,
                class_maps(rs, info, run_arrays([r.classes for r in rs])),
            )
            b.decompress(self.pack, spans)
            b.decode()
            out.append(b)
        return out

    def close(self) -> None:
        pass
