"""Staging the sparse tensors of one element type on the GPU, with no host synchronisation.

Stream tables are read on the host (codec/cuda/kernels/stream_tables.py); the streams are decoded on the
GPU (decode_streams.py: nvCOMP zstd), then turned into event bitmaps and residuals (stage_symbols.py),
checked against the class counts of the live weights and placed (stage_place.py), all
batched over every chunk of every tensor. Every check leaves a device flag; the caller
reads flags and digest sums of all batches in one transfer and raises before anything is
written."""

from concurrent.futures import Executor
from functools import cached_property
from typing import NamedTuple, cast

import numpy as np
import torch
from numba import njit

from weight_teleport.codec import streams as codecs
from weight_teleport.codec.cuda.kernels import (
    chunk_table,
    class_ranks,
    stage_bitmap,
    stage_place,
    stage_symbols,
    stream_tables,
)
from weight_teleport.codec.cuda.runtime import memory, nvcomp
from weight_teleport.codec.cuda.stage import decode_streams
from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.live import Live
from weight_teleport.format.container import ChunkSpans

FLAGS = (
    "a symbol stream failed to decode (corrupt stored stream)",
    "sparse class streams are malformed",
    "sparse chunk does not fit the receiver's weights (raised as `patch.misfit`)",
)
"""What each of a batch's device flags means, in the order they are raised."""


class Streams(NamedTuple):
    """A batch's stream tables and the plan of their decoding (`StreamsRead`)."""

    table: stream_tables.StreamTable
    prep: decode_streams.Prepared


@njit(nogil=True, cache=True)
def _walk(
    pack,
    starts,
    lengths,
    classes,
    ncp,
    events,
    codec,
    raw,
    stored,
    at,
    lo,
    out_off,
    copies,
    coded,
    comp_off,
    coded_raw,
    coded_stored,
    coded_dst,
    coded_group,
    order,
    cuts,
    keys,
    rows,
):
    """In one compiled call: the stream tables of every chunk (`stream_tables._read`, into
    tables zeroed here but `at`, which it fills), the decode buffer's layout of their streams
    (`decode_streams._plan`), and the coded streams sorted by codec and size bucket, with
    their table for nvCOMP
    (`nvcomp.bucket_sort`, `plan_rows`; `rows` holds [4, coded streams] from its front).
    (The first malformed chunk or -1, then `_plan`'s results, then the number of groups.)"""
    events[:] = 0
    for t in (codec, raw, stored):
        t[:, :] = 0
    bad = stream_tables._read(pack, starts, lengths, classes, ncp, 0, starts.size, events, codec, raw, stored, at)
    if bad >= 0:
        return bad, -1, 0, 0, 0, 0, 0
    flat_codec, flat_raw, flat_stored = codec.reshape(-1), raw.reshape(-1), stored.reshape(-1)
    s, out_total, comp_total, z, k = decode_streams._plan(
        flat_codec, flat_raw, flat_stored, at.reshape(-1), lo, out_off, copies, coded, comp_off
    )
    if s >= 0:
        return -1, s, out_total, comp_total, z, k, 0
    for j in range(z):
        i = coded[j]
        coded_raw[j], coded_stored[j], coded_dst[j] = flat_raw[i], flat_stored[i], out_off[i]
        coded_group[j] = nvcomp.coded_group(flat_codec[i])
    n_groups = nvcomp.bucket_sort(coded_raw[:z], coded_group[:z], order[:z], cuts, keys)
    nvcomp.plan_rows(
        order[:z], comp_off[:z], coded_stored[:z], coded_raw[:z], coded_dst[:z], rows[: 4 * z].reshape((4, z))
    )
    return -1, s, out_total, comp_total, z, k, n_groups


class StreamsRead:
    """The stream tables of a batch's chunks and their streams' layout in the decode buffer,
    read by one compiled walk on a helper thread from the start of a stage call, while the
    caller launches the class counts. The walk holds no GIL from start to end: a helper that
    took the GIL between its steps would wait for the caller's Python at each, and be slower
    than the caller reading the tables itself."""

    def __init__(
        self, pack, spans: ChunkSpans, recs: list, n_classes: np.ndarray, lo: int, hi: int | None, pool: Executor
    ):
        """Starts the walk over the records' chunks (`spans`, in order; `n_classes` classes
        per record) on `pool`; its arrays are the calling thread's temporaries
        (`memory.arena`). [lo, hi) are the pack's bytes that go to the device (hi None: a
        `decode_streams.Upload` of them from `lo`)."""
        stream_tables.check_lengths(spans.lengths)
        # read_header has checked that each record has the chunks its shape needs, and
        # _lives that each shape is its live tensor's: chunk i is the chunk table's row i
        k = np.repeat(n_classes, [len(r.chunks) for r in recs])
        ncp = class_ranks.pow2(int(n_classes.max()))
        self.pack, self.table = pack, stream_tables.empty(spans.starts.size, ncp, zeros=False)
        self.n_classes, self.lo, self.hi = n_classes, lo, hi
        n = self.table.codec.size
        self.arrays = decode_streams.layout_arrays(n)
        arena = memory.arena()
        sizes = (n, n, n, n, n, nvcomp.N_KEYS + 1, nvcomp.N_KEYS, 4 * n)
        self.buckets = [arena.empty(size, np.int64) for size in sizes]
        self.done = pool.submit(  # type: ignore[call-arg]  # star-args of unknown length fill the walk's 23
            _walk,
            np.frombuffer(pack, np.uint8),
            spans.starts,
            spans.lengths,
            k,
            ncp,
            *self.table.arrays(),
            self.lo,
            *self.arrays,
            *self.buckets,
        )

    def result(self, device, cfg: CudaCodecConfig | None = None) -> Streams:
        """The tables and the plan of their decoding (`cfg`: its backend), once the walk is
        done; PackFormatError for a malformed chunk table or a refused stream."""
        bad, *planned, n_groups = self.done.result()
        stream_tables.check(bad >= 0)
        codec, raw, stored, at = (
            a.reshape(-1) for a in (self.table.codec, self.table.raw, self.table.stored, self.table.at)
        )
        lay = decode_streams.laid_out(self.pack, codec, raw, stored, at, self.arrays, tuple(planned))
        z, (order, cuts, keys, rows) = lay.coded.size, self.buckets[4:]
        self.bucketed = order[:z], nvcomp.bucket_ranges(cuts, keys, n_groups), rows[: 4 * z].reshape(4, z)
        prep = decode_streams.planned(lay, self.lo, self.hi, codec, raw, stored, device, cfg, self.bucketed)
        return Streams(self.table, prep)


class SparseBatch:
    """The sparse tensors of one element type, staged; `flags` and `sums` are device tensors."""

    def __init__(self, lives: list[Live], recs: list, header, maps: tuple):
        """The chunk table, the class counts of the live weights and their rank bases, which
        need no byte of the pack: the caller launches them first, then queues the pack's copy
        to the device, then `decompress`es and `decode`s. `maps`: `plan.class_maps` of the
        records."""
        self.lives, self.recs, self.info = lives, recs, lives[0].info
        luts, inverted, self.n_classes = maps
        self.ncp = class_ranks.pow2(int(self.n_classes.max()))
        self.table = self._chunk_table(header.chunk_elems)
        self._inv_tensors = inverted[:, : self.ncp].astype(np.int8)
        dev = self.table.base.device
        self.luts = memory.upload(luts, dev)
        self.inv = memory.upload(self._inv_tensors, dev)
        self.counts, self.old_sums = class_ranks.table_counts(
            self.table, self.luts, self.info, self.ncp, int(self.n_classes.max())
        )
        self.base, self.tot = class_ranks.table_bases(self.counts, self.table)
        # the segments' event bitmaps (at most a word a 32 elements and a word a segment more)
        # are cleared here, on the caller's stream after the counts, while the decompression
        # runs on its own, not in `decode`, where clearing them (a GB for a large state) would
        # sit in the chain between the decompression and the symbol decoder
        n_words = int((-(-self.table.host[:, chunk_table.LEN] // 32)).sum()) + self.table.chunks * self.ncp
        self.bitmap: torch.Tensor | None = torch.zeros(max(n_words, 1), dtype=torch.int32, device=dev)

    def decompress(
        self, pack, streams: Streams, threads: int | None, upload: decode_streams.Upload | None = None
    ) -> None:
        """Launches the decompression of the records' streams (`StreamsRead`): the chain of
        kernels starts there, and the host's work before its launch is the stage's critical
        path, so checks that can wait are made after it."""
        self.streams = streams.table
        self._check_lengths()  # the lengths size the decode buffers: checked before any is made
        self._inflated = decode_streams.inflate(
            pack, streams.table, self.table.base.device, threads, upload, streams.prep
        )

    def decode(self) -> None:
        """Launches the rest of the decoding, after `decompress`."""
        st, inf, dev = self.streams, self._inflated, self.table.base.device
        self.inverted = self._inv_tensors[self.table.host[:, chunk_table.TENSOR]].reshape(-1).astype(bool)
        self.res_cnt = np.where(self.inverted, st.raw[:, 2], st.events)
        n_res = int(self.res_cnt.sum())
        ev, res_cnt, inv, raw, res_off = memory.to_device(
            [st.events, self.res_cnt, self.inverted, st.raw, memory.starts(self.res_cnt)], dev
        )
        inv = inv != 0
        tot = self.tot.view(-1)
        seg_word = memory.starts((tot + 31) // 32)
        # freed with the decoding's other temporaries
        words, self.bitmap = cast(torch.Tensor, self.bitmap), None
        dec = stage_symbols.decode(
            inf.buffer,
            memory.to_device([inf.offsets], dev)[0],
            raw,
            ev,
            res_cnt,
            inv,
            seg_word,
            words,
            n_res,
            self.info.bits,
        )
        self.place(dec, ev, res_cnt, inv, res_off, seg_word, inf.failed)

    def place(self, dec: stage_symbols.Decoded, ev, res_cnt, inv, res_off, seg_word, failed) -> None:
        """Checks the decoded segments (`dec`; per segment, device tensors: events, changes,
        inverted, first residual, first bitmap word) against the live weights' class counts,
        places their changes and takes the digest sums; `failed`: the streams' own flag."""
        tot = self.tot.view(-1)
        unfit = (ev > tot).any() | (inv & (res_cnt != tot - ev)).any() | ((ev > 0) & (dec.last_rank >= tot)).any()
        self.pos, self.val, sums = stage_place.decode(
            self.table,
            self.luts,
            self.inv,
            int(self.n_classes.max()),
            self.counts,
            self.base,
            seg_word,
            dec.bitmap,
            stage_bitmap.prefix(dec.bitmap),
            res_off,
            dec.residuals,
            self.info,
            self.old_sums,
        )
        self.sums = self.table.per_tensor(sums)
        self.flags = torch.stack([failed, dec.malformed, unfit])

    def _chunk_table(self, chunk_elems: int) -> chunk_table.ChunkTable:
        """The chunk table of the batch's live tensors (their records' walks: a record over a
        box stages against a walk view of its box), cut as their records are (regular
        chunks, or a record's `cuts`). A contiguous tensor's rows need only its pointer and
        size: only the base, and tensors that are not contiguous (copies), get flat views (a
        flat view costs four torch calls, on the stage's host path). A live tensor holding
        some chunks of its record numbers its digest words from its `origin`."""
        flats = [lv.tensor if lv.in_place else lv.u for lv in self.lives]
        cuts = [r.cuts for r in self.recs]
        origins = [lv.origin for lv in self.lives]
        return chunk_table.build_cached(
            flats,
            chunk_elems,
            class_ranks.stage_block(flats[0]),
            self.info,
            cuts if any(cuts) else None,
            origins if any(origins) else None,
        )

    def _check_lengths(self) -> None:
        st, shape = self.streams, (self.table.chunks, self.ncp)
        codecs.check_sparse_lengths(
            st.events.reshape(shape), st.raw.reshape(*shape, 4), self.table.host[:, chunk_table.LEN], self.info.nbytes
        )

    @cached_property
    def chunk_changes(self) -> np.ndarray:
        """Changes per chunk (host), in the order of the staged outputs."""
        return self.res_cnt.reshape(self.table.chunks, self.ncp).sum(1)

    @cached_property
    def chunk_first_change(self) -> np.ndarray:
        """Where each chunk's changes start in the staged outputs."""
        return memory.starts(self.chunk_changes)
