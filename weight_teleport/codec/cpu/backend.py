"""The CPU backend: numba kernels over chunks on a thread pool, zstd streams. Each codec's
chunks are coded by the functions its line in the registry names (codec/registry.py)."""

import os
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from weight_teleport.codec import digest as D
from weight_teleport.codec import registry, streams
from weight_teleport.codec import walks as W
from weight_teleport.codec.cpu import chunks as C
from weight_teleport.codec.cpu import kernels as K
from weight_teleport.codec.dtypes import BY_NAME, DtypeInfo, as_uint, contiguous
from weight_teleport.codec.items import EncodeItem, Encoded, walk_cuts
from weight_teleport.codec.patch import ChunkMisfit, ChunkPatch, StagedPatch, TensorPatch, misfit
from weight_teleport.codec.plan import SPARSE_MAX_DENSITY, class_maps, plan_classes
from weight_teleport.format.codecs import pick
from weight_teleport.errors import DigestMismatchError, PackFormatError, PackMismatchError, UnsupportedFormatError
from weight_teleport.format import ChunkRef, PackHeader, TensorRecord, chunk_payload

SAME, DENSE_CODECS, SPARSE_CODECS = (registry.family(f) for f in ("same", "dense", "sparse"))


def item(
    name: str, info: DtypeInfo, new: torch.Tensor, old: torch.Tensor | None, cuts=None, chunk_digests: bool = False
) -> EncodeItem:
    """The bit patterns of one tensor (and of its base, for deltas) to encode, flattened in
    row-major order (a walk view: codec/walks.py); `cuts`, `chunk_digests` as EncodeItem's."""
    return EncodeItem(
        name, info, tuple(new.shape), as_uint(new), None if old is None else as_uint(old), cuts, chunk_digests
    )


def walk_item(
    name: str,
    info: DtypeInfo,
    new: torch.Tensor,
    old: torch.Tensor | None,
    sl: W.TensorSlice,
    hint: W.Hint,
    chunk_elems: int,
) -> EncodeItem:
    """The item of a record over a walk of the box `sl`, cut where `hint.bounds` fall, with
    a digest per chunk (receivers holding slices verify the chunks they stage alone). `new`
    and `old` are views whose row-major order is the walk, flattened here."""
    new, old = contiguous(new).reshape(-1), None if old is None else contiguous(old).reshape(-1)
    return item(name, info, new, old, walk_cuts(sl, hint, new.numel(), chunk_elems), chunk_digests=True)


def _no_config(config) -> None:
    if config is not None:
        raise ValueError(
            "a CUDA codec configuration was given for CPU tensors; move the state to a "
            "CUDA device or leave `cuda` unset"
        )


def digest(tensor: torch.Tensor) -> str:
    """The pack digest of a CPU tensor's bytes, in hex."""
    u = as_uint(tensor)
    return D.to_hex(D.finish(C.digest_sum(u, 0), u.nbytes))


def digests(tensors: list[torch.Tensor]) -> list[str]:
    """`digest` of each tensor."""
    return [digest(t) for t in tensors]


def _pool(threads: int | None) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1)


def _first_word(start: int, info: DtypeInfo) -> int:
    return start * info.nbytes // 8


def _scan(item: EncodeItem, start: int, stop: int):
    """Key histograms and digest sums of one chunk of a delta (or snapshot) item."""
    new = item.new[start:stop]
    s_new = C.digest_sum(new, _first_word(start, item.info))
    if item.old is None:
        return None, None, None, s_new
    old = item.old[start:stop]
    total = np.zeros(C.n_keys(item.info), np.int64)
    changed = np.zeros_like(total)
    shift, kmask, _, _ = C.consts(item.info)
    K.key_histogram(old, new, shift, kmask, total, changed)
    return total, changed, C.digest_sum(old, _first_word(start, item.info)), s_new


def _candidates(item: EncodeItem, changed: int, sparse: str) -> tuple[str, ...]:
    """The codecs tried for an item's chunks (the smallest output is kept)."""
    if item.old is None:
        return registry.SNAPSHOT
    if changed == 0:
        return ()
    if changed <= SPARSE_MAX_DENSITY * item.new.size:
        return (sparse,)
    return (sparse, *DENSE_CODECS)


def encode(
    items: list[EncodeItem],
    chunk_elems: int,
    level: int,
    threads: int | None,
    config=None,
    pinned: bool = False,
    codec: str = registry.DEFAULT,
) -> Encoded:
    """The backend interface's encode (codec/backend.py): zstd streams at `level`, sparse
    records of `codec`; `config` must be None; the chunks are host bytes whatever `pinned`
    says."""
    _no_config(config)
    records, chunks = encode_chunks(items, chunk_elems, level, threads, codec)
    return Encoded(records, chunks, lambda: None, ["raw", "zstd"])


def encode_chunks(
    items: list[EncodeItem], chunk_elems: int, level: int, threads: int | None, choice: str = registry.DEFAULT
):
    """Records (chunk offsets relative to the returned chunk list) and chunk bytes; sparse
    records of the codec `choice` picks for each (`format.codecs.pick`), dense ones of the codec
    that codes them smallest."""
    coders: dict[str, Callable] = {}
    ranges = [it.spans(it.new.size, chunk_elems) for it in items]
    with _pool(threads) as pool:
        scans = [list(pool.map(lambda r, it=it: _scan(it, *r), rs)) for it, rs in zip(items, ranges)]
        records, jobs = [], []
        for it, rs, sc in zip(items, ranges, scans):
            rec, plan, sparse = _record(it, sc, choice)
            if it.chunk_digests and (it.old is None or rec.changed):
                _add_chunk_digests(rec, it, rs, sc)
            records.append(rec)
            for codec in _candidates(it, rec.changed, sparse):
                if codec not in coders:
                    coders[codec] = registry.cpu_coder(codec)[0]
                sparse_family = codec in SPARSE_CODECS
                for r, s in zip(rs, sc):
                    jobs.append(
                        (
                            len(records) - 1,
                            codec,
                            pool.submit(_encode_chunk, it, r, s, coders[codec], sparse_family, plan, level),
                        )
                    )
        outputs: dict[tuple[int, str], list[bytes]] = {}
        for idx, codec, fut in jobs:
            outputs.setdefault((idx, codec), []).append(fut.result())
    return _lay_out(records, outputs)


def _record(it: EncodeItem, sc, choice: str) -> tuple[TensorRecord, object, str]:
    """The item's record (without chunks) from its chunks' scans, its class plan (None:
    nothing to code with a sparse codec) and the sparse codec `choice` picks for it."""
    nbytes = it.new.size * it.info.nbytes
    rec = TensorRecord(
        name=it.name,
        dtype=it.info.name,
        shape=it.shape,
        codec=registry.SNAPSHOT[0],
        digest=D.to_hex(D.finish(sum(s[3] for s in sc), nbytes)),
        changed=it.new.size,
    )
    if it.old is None:
        return rec, None, choice
    rec.base_digest = D.to_hex(D.finish(sum(s[2] for s in sc), nbytes))
    total = sum(s[0] for s in sc) if sc else np.zeros(C.n_keys(it.info), np.int64)
    changed = sum(s[1] for s in sc) if sc else np.zeros_like(total)
    rec.changed = int(changed.sum())
    rec.codec = registry.SAME
    sparse = pick(choice, rec.changed, it.new.size)
    if rec.changed == 0:
        return rec, None, sparse
    plan = plan_classes(total, changed, sparse)
    rec.classes, rec.inverted = plan.runs, [int(c) for c in np.flatnonzero(plan.inverted)]
    return rec, plan, sparse


def _add_chunk_digests(rec: TensorRecord, it: EncodeItem, spans, scans) -> None:
    """A digest per chunk (its words numbered by their place in the walk: they add up to the
    record's), and the cuts where the chunks are not the regular ones."""
    nb = it.info.nbytes
    rec.chunk_digests = [D.to_hex(D.finish(sc[3], (e - s) * nb)) for (s, e), sc in zip(spans, scans)]
    if it.old is not None:
        rec.chunk_base_digests = [D.to_hex(D.finish(sc[2], (e - s) * nb)) for (s, e), sc in zip(spans, scans)]
    if it.cuts is not None:
        rec.cuts = list(it.cuts)


def _encode_chunk(it: EncodeItem, r, scan, encode: Callable, sparse: bool, plan, level: int) -> bytes:
    """The chunk [start, stop) of an item coded by `encode`, a codec's chunk encoder (of a
    sparse codec: its class plan and key histograms are the chunk's scan)."""
    start, stop = r
    new = it.new[start:stop]
    old = None if it.old is None else it.old[start:stop]
    if sparse:
        return encode(old, new, it.info, plan, scan[0], scan[1], level)
    return encode(old, new, it.info, level)


def _lay_out(records: list[TensorRecord], outputs):
    chunks, offset = [], 0
    for idx, rec in enumerate(records):
        options = {codec: parts for (i, codec), parts in outputs.items() if i == idx}
        if not options:
            continue
        codec = min(options, key=lambda c: sum(len(p) for p in options[c]))
        if codec not in SPARSE_CODECS:
            rec.classes, rec.inverted = [], []
        rec.codec = codec
        for part in options[codec]:
            rec.chunks.append(ChunkRef(offset, len(part), zlib.crc32(part)))
            chunks.append(part)
            offset += len(part)
    return records, chunks


class Live:
    """The bit patterns of a live tensor (a view when it is contiguous, else a copy)."""

    def __init__(self, tensor: torch.Tensor, info: DtypeInfo):
        self.tensor, self.info = tensor, info
        self.u = as_uint(tensor)
        u8 = self.u.view(np.uint8)
        self.n_full = u8.size // 8
        self.words = u8[: self.n_full * 8].view(np.uint64)
        tail = np.zeros(8, np.uint8)
        tail[: u8.size % 8] = u8[self.n_full * 8 :]
        self.tail = tail.view(np.uint64)[0]

    def commit(self) -> None:
        """Write a patched copy back into a non-contiguous tensor."""
        if not self.tensor.is_contiguous():
            flat = torch.from_numpy(self.u).view(self.info.int_torch).view(self.tensor.shape)
            self.tensor.view(self.info.int_torch).copy_(flat)


def _stage_chunk(
    live: Live,
    rec: TensorRecord,
    decode: Callable,
    ref: ChunkRef,
    start: int,
    stop: int,
    pack,
    header: PackHeader,
    lut,
    inverted,
    check_base: bool,
    walk_start: int = 0,
):
    """(ChunkPatch, old digest sum or None, new digest sum or delta) of one chunk, the walk's
    elements [start, stop), decoded by `decode` (the chunk decoder of the record's codec);
    `live` holds the walk from element `walk_start` on."""
    info = live.info
    data = chunk_payload(pack, header, ref)
    fw = _first_word(start, info)
    start, stop = start - walk_start, stop - walk_start
    old = live.u[start:stop]
    needs_old = check_base or (rec.codec in DENSE_CODECS and header.kind == "delta")
    s_old = C.digest_sum(old, fw) if needs_old else None
    if rec.codec in SPARSE_CODECS:
        pos, val = decode(old, data, info, lut, inverted)
        wmask = np.uint64((1 << info.bits) - 1)
        delta = int(
            K.digest_patch_delta(
                live.words, live.tail, live.n_full, start, info.nbytes, pos, val, wmask, _first_word(walk_start, info)
            )
        )
        return ChunkPatch(start, pos, val), s_old, delta
    values = decode(old, data, info, stop - start)
    s_new = C.digest_sum(values, fw)
    if header.kind == "snapshot":
        return ChunkPatch(start, None, values), s_old, s_new
    assert s_old is not None  # a dense delta reads its base
    return ChunkPatch(start, None, values), s_old, s_new - s_old


def check_readable(stream_codecs: list[str]) -> None:
    """UnsupportedFormatError unless the CPU decodes every stream codec named."""
    unknown = set(stream_codecs) - {streams.NAMES[c] for c in streams.CPU_READABLE}
    if unknown:
        raise UnsupportedFormatError(
            f"pack uses stream codecs {sorted(unknown)} that the CPU cannot decode; stage it onto CUDA "
            "weights, or ask its writer for portable zstd packs (CudaCodecConfig(stream_coder='huffman'), the default)"
        )


def check_stage(header: PackHeader, windows: dict) -> None:
    """UnsupportedFormatError unless the CPU decodes the pack's stream codecs (it stages
    records in part and cut records)."""
    check_readable(header.stream_codecs)


def stage(
    lives: dict[str, Live],
    header: PackHeader,
    pack,
    check_base: bool,
    threads: int | None,
    windows: dict | None = None,
    config=None,
):
    """Decode and verify every chunk against the live weights; nothing is written. Records
    named in `lives` only. `windows`: name -> (walk_start, first chunk, stop chunk) of the
    records a receiver holds a slice of: `lives[name]` holds the walk from `walk_start`, and
    those chunks alone are staged, each checked against its own digests. `config` must be
    None (ValueError)."""
    _no_config(config)
    windows = windows or {}
    recs = [rec for rec in header.tensors if rec.name in lives]
    decoders: dict[str, Callable] = {}
    with _pool(threads) as pool:
        futures = []
        for rec in recs:
            live = lives[rec.name]
            lut = inverted = None
            if rec.codec in SPARSE_CODECS:
                lut, inverted = _class_map(rec, live.info)
            walk_start, lo, hi = windows.get(rec.name, (0, 0, len(rec.chunks)))
            rs = rec.chunk_spans(header.chunk_elems)[lo:hi]
            if rec.codec in SAME:
                futures.append([pool.submit(_unchanged, live)] if check_base and rec.name not in windows else [])
                continue
            if rec.codec not in decoders:
                decoders[rec.codec] = registry.cpu_coder(rec.codec)[1]
            decode = decoders[rec.codec]
            futures.append(
                [
                    pool.submit(
                        _stage_chunk, live, rec, decode, ref, s, e, pack, header, lut, inverted, check_base, walk_start
                    )
                    for ref, (s, e) in zip(rec.chunks[lo:hi], rs)
                ]
            )
        try:
            results = [[f.result() for f in fs] for fs in futures]
        except ChunkMisfit:
            raise _misfit(recs, lives, header, check_base, windows) from None
    tensors = [
        _verify_window(rec, lives[rec.name], res, header, check_base, windows[rec.name])
        if rec.name in windows
        else _verify(rec, lives[rec.name], res, header, check_base)
        for rec, res in zip(recs, results)
    ]
    return StagedPatch(header.kind, header.version, header.base_version, tensors, check_base)


def _misfit(
    recs: list[TensorRecord], lives: dict[str, Live], header: PackHeader, check_base: bool, windows: dict
) -> PackFormatError:
    """Why a sparse chunk did not fit: the first tensor that is not the pack's base (its
    digest, read now), else corrupt streams, or a base that went unchecked."""
    if check_base:
        for rec in recs:
            if rec.codec in SPARSE_CODECS and rec.name not in windows:
                live = lives[rec.name]
                _check_base(rec, live, C.digest_sum(live.u, 0), header)
    return misfit(header.base_version, check_base)


def _check_base(rec: TensorRecord, live: Live, s_old: int, header: PackHeader) -> None:
    actual = D.to_hex(D.finish(s_old, rec.numel * live.info.nbytes))
    if actual != rec.base_digest:
        raise PackMismatchError(
            f"tensor {rec.name!r} does not hold the weights of base version {header.base_version} "
            f"(digest {actual}, expected {rec.base_digest}): the state is at another version or "
            "was modified; resync from a snapshot"
        )


def _verify_window(rec: TensorRecord, live: Live, results, header: PackHeader, check_base: bool, window) -> TensorPatch:
    """`_verify` for some chunks of a record: each against its chunk digests."""
    walk_start, lo, hi = window
    spans = rec.chunk_spans(header.chunk_elems)[lo:hi]
    if hi > lo and not rec.chunk_digests:
        raise PackMismatchError(
            f"tensor {rec.name!r}: the pack has no chunk digests, so a slice of it "
            "cannot be verified alone; stage the whole record"
        )
    for k, ((s, e), res) in enumerate(zip(spans, results)):
        nbytes = (e - s) * live.info.nbytes
        if header.kind == "delta":
            base = D.from_hex(rec.chunk_base_digests[lo + k])
            if check_base and D.finish(res[1], nbytes) != base:
                raise PackMismatchError(
                    f"tensor {rec.name!r}: the slice does not hold the weights of base version "
                    f"{header.base_version} (chunk {lo + k}); resync from a snapshot"
                )
            predicted = D.finish(D.word_sum(base, nbytes) + res[2], nbytes)
        else:
            predicted = D.finish(res[2], nbytes)
        if predicted != D.from_hex(rec.chunk_digests[lo + k]):
            raise DigestMismatchError(
                f"tensor {rec.name!r}: chunk {lo + k} would not have the digest the "
                "pack promises; the pack is corrupt or was encoded from other weights"
            )
    chunks = [r[0] for r in results]
    return TensorPatch(rec.name, BY_NAME[rec.dtype], (live.u.size,), 0, chunks)


def _unchanged(live: Live):
    """The stage result of a tensor the pack leaves alone: no patch, its old digest sum,
    no change to it."""
    return None, C.digest_sum(live.u, 0), 0


def _class_map(rec: TensorRecord, info: DtypeInfo):
    """(class of every key, inverted flag of every class) of a sparse record."""
    luts, inverted, n_classes = class_maps([rec], info)
    return luts[0], inverted[0, : n_classes[0]]


def _verify(rec: TensorRecord, live: Live, results, header: PackHeader, check_base: bool) -> TensorPatch:
    kind = header.kind
    nbytes = rec.numel * live.info.nbytes
    digest = D.from_hex(rec.digest)
    if kind == "delta" and check_base:
        _check_base(rec, live, sum(r[1] for r in results), header)
    if kind == "delta":
        predicted = D.finish(D.word_sum(D.from_hex(rec.base_digest), nbytes) + sum(r[2] for r in results), nbytes)
    else:
        predicted = D.finish(sum(r[2] for r in results), nbytes)
    if predicted != digest:
        raise DigestMismatchError(
            f"tensor {rec.name!r}: the patched weights would have digest {D.to_hex(predicted)}, "
            f"the pack promises {rec.digest}; the pack is corrupt or was encoded from other weights"
        )
    chunks = [r[0] for r in results if r[0] is not None]
    return TensorPatch(rec.name, BY_NAME[rec.dtype], rec.shape, digest, chunks)


def bind(lives: dict[str, Live], staged: StagedPatch, threads: int | None, relocate: bool = False):
    """The writes of a staged patch into the live weights, as a function (`apply` on lives
    made when it is called: a Live of a tensor that is not contiguous holds a copy of it)."""
    return lambda: _apply({n: Live(lv.tensor, lv.info) for n, lv in lives.items()}, staged, threads)


def _apply(lives: dict[str, Live], staged: StagedPatch, threads: int | None) -> None:
    """Write a staged patch into the live weights (its positions are relative to each live
    tensor: a patch staged against a copy writes the same)."""
    jobs = [(lives[t.name], c) for t in staged.tensors for c in t.chunks]
    with _pool(threads) as pool:
        list(pool.map(lambda job: _apply_chunk(*job), jobs))
    for t in staged.tensors:
        if t.chunks:
            lives[t.name].commit()


def _apply_chunk(live: Live, chunk: ChunkPatch) -> None:
    if chunk.positions is None:
        live.u[chunk.start : chunk.start + chunk.values.size] = chunk.values
    else:
        K.scatter(live.u[chunk.start :], chunk.positions, chunk.values)
