"""One chunk on the CPU: the chunk coders of codecs `sparse`, `dense_residual` and
`dense_values` (kernels in, format groups out), and what every sparse codec's chunk coder
builds on: a chunk's events by class (`chunk_events`) and their placement (`place`)."""

import numpy as np

from weight_teleport.codec.cpu import kernels as K
from weight_teleport.codec.dtypes import DtypeInfo
from weight_teleport.codec.patch import ChunkMisfit
from weight_teleport.codec.plan import ClassPlan
from weight_teleport.codec.streams import check_sparse_lengths, decode_stream, encode_stream
from weight_teleport.errors import PackFormatError
from weight_teleport.format import Group, Stream, read_groups, write_groups

U64 = np.uint64


def consts(info: DtypeInfo) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:
    """(shift, key mask, float sign bit or 0, element mask) as the kernels take them."""
    wmask = U64((1 << info.bits) - 1)
    signbit = U64(1 << (info.bits - 1)) if info.is_float else U64(0)
    return U64(info.mantissa_bits), U64((1 << info.exponent_bits) - 1), signbit, wmask


def n_keys(info: DtypeInfo) -> int:
    return 1 << info.exponent_bits


def digest_sum(data: np.ndarray, first_word: int) -> int:
    """Sum of digest terms over the bytes of `data`, whose first byte starts word `first_word`
    (a partial last word is zero-padded)."""
    u8 = data.view(np.uint8)
    n_full = u8.size // 8
    s = int(K.digest_words(u8[: n_full * 8].view(np.uint64), first_word))
    if u8.size % 8:
        tail = np.zeros(8, np.uint8)
        tail[: u8.size % 8] = u8[n_full * 8 :]
        s += int(K.digest_words(tail.view(np.uint64), first_word + n_full))
    return s & ((1 << 64) - 1)


def _stream(data: np.ndarray, level: int) -> Stream:
    codec, payload = encode_stream(data, level)
    return Stream(codec, data.nbytes, payload)


def _decoded(stream: Stream, dtype=np.uint8) -> np.ndarray:
    raw = decode_stream(stream.codec, stream.data, stream.raw_len)
    if raw.size % np.dtype(dtype).itemsize:
        raise PackFormatError("stream length is not a whole number of elements")
    return raw.view(dtype)


def class_counts(plan: ClassPlan, total: np.ndarray, changed: np.ndarray):
    """Per class: elements, changed elements and coded events (changes, or non-changes
    where the class is inverted) of one chunk, from its key histograms."""
    n = plan.n_classes
    tot = np.bincount(plan.lut, weights=total, minlength=n).astype(np.int64)
    chg = np.bincount(plan.lut, weights=changed, minlength=n).astype(np.int64)
    events = np.where(plan.inverted, tot - chg, chg)
    return tot, chg, events


def starts(counts: np.ndarray) -> np.ndarray:
    """Where each of `counts` starts when laid end to end (int64)."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def chunk_events(old, new, info: DtypeInfo, plan: ClassPlan, total, changed):
    """(events, changes, gaps, residuals) of a chunk: per class its events' and changes'
    counts, and the gaps and residuals of every class back to back in class order."""
    shift, kmask, signbit, wmask = consts(info)
    _, chg, events = class_counts(plan, total, changed)
    gaps = np.empty(int(events.sum()), np.int64)
    res = np.empty(int(chg.sum()), np.uint64)
    K.sparse_encode(
        old, new, shift, kmask, plan.lut, plan.inverted, signbit, wmask, starts(events), starts(chg), gaps, res
    )
    return events, chg, gaps, res


def encode_sparse(old, new, info: DtypeInfo, plan: ClassPlan, total, changed, level: int) -> bytes:
    events, chg, gaps, res = chunk_events(old, new, info, plan, total, changed)
    ev_off, res_off = starts(events), starts(chg)
    wmask = U64((1 << info.bits) - 1)
    groups = []
    for c in range(plan.n_classes):
        if events[c] == 0 and chg[c] == 0:
            groups.append(Group(0, []))
            continue
        g = gaps[ev_off[c] : ev_off[c] + events[c]]
        r = res[res_off[c] : res_off[c] + chg[c]]
        syms = np.empty(g.size, np.uint8)
        bits = np.empty(g.size * 4 + 8, np.uint8)
        rsyms = np.empty(max(g.size, r.size), np.uint8)
        esc = np.empty(rsyms.size, np.uint64)
        nbits, n_r, n_esc = K.class_to_symbols(
            g, r, not plan.inverted[c], U64(1 << (info.bits - 1)), wmask, syms, bits, rsyms, esc
        )
        streams = [syms, bits[:nbits], rsyms[:n_r], esc[:n_esc].astype(info.uint_numpy)]
        groups.append(Group(int(events[c]), [_stream(s, level) for s in streams]))
    return write_groups(groups)


def _class_streams(group: Group, inverted: bool, info: DtypeInfo):
    """Gaps and residuals of one class from its group (`_check_tables` has checked it)."""
    if not group.streams:
        return np.zeros(0, np.int64), np.zeros(0, np.uint64)
    syms, bits, rsyms = (_decoded(s) for s in group.streams[:3])
    esc = _decoded(group.streams[3], info.uint_numpy).astype(np.uint64)
    gaps = np.empty(syms.size, np.int64)
    res = np.empty(rsyms.size if inverted else syms.size, np.uint64)
    if not K.symbols_to_class(syms, bits, rsyms, esc, not inverted, U64((1 << info.bits) - 1), gaps, res):
        raise PackFormatError("sparse class streams are malformed")
    return gaps, res


def _check_sizes(groups: list[Group], limit: int) -> None:
    """Refuse streams that claim more raw bytes than a chunk can hold, before any is inflated."""
    if any(s.raw_len > limit for g in groups for s in g.streams):
        raise PackFormatError(f"a stream claims more than the {limit} bytes its chunk can hold")


def _check_tables(groups: list[Group], n_classes: int, elems: int, width: int) -> None:
    """The classes of a sparse chunk of `elems` elements, as the format allows them, before
    any stream is decoded."""
    if len(groups) != n_classes:
        raise PackFormatError(f"sparse chunk has {len(groups)} classes, its tensor {n_classes}")
    raw = np.zeros((1, n_classes, 4), np.int64)
    for c, g in enumerate(groups):
        if len(g.streams) not in (0, 4):
            raise PackFormatError(f"sparse class has {len(g.streams)} streams, expected 4")
        raw[0, c, : len(g.streams)] = [s.raw_len for s in g.streams]
    events = np.array([[g.count for g in groups]], np.int64)
    check_sparse_lengths(events, raw, np.array([elems], np.int64), width)


def decode_sparse(old, chunk, info: DtypeInfo, lut: np.ndarray, inverted: np.ndarray):
    """Positions (ascending) and new bit patterns of the changed elements of a chunk."""
    groups = read_groups(chunk)
    _check_tables(groups, inverted.size, old.size, info.nbytes)
    parts = [_class_streams(g, bool(inv), info) for g, inv in zip(groups, inverted)]
    ev_cnt = np.array([p[0].size for p in parts], np.int64)
    res_cnt = np.array([p[1].size for p in parts], np.int64)
    gaps = np.concatenate([p[0] for p in parts])
    res = np.concatenate([p[1] for p in parts])
    return place(old, info, lut, inverted, ev_cnt, gaps, res_cnt, res)


def place(old, info: DtypeInfo, lut, inverted, ev_cnt, gaps, res_cnt, res):
    """Positions and new bit patterns from every class's gaps and residuals."""
    shift, kmask, signbit, wmask = consts(info)
    pos = np.empty(res.size, np.int64)
    val = np.empty(res.size, info.uint_numpy)
    n = K.sparse_decode(
        old,
        shift,
        kmask,
        lut,
        inverted,
        signbit,
        wmask,
        starts(ev_cnt),
        ev_cnt,
        gaps,
        starts(res_cnt),
        res_cnt,
        res,
        pos,
        val,
    )
    if n != res.size:
        raise ChunkMisfit("sparse chunk does not fit the receiver's weights")
    return pos, val


def _planes(values: np.ndarray) -> list[np.ndarray]:
    wb = values.dtype.itemsize
    bytes2d = values.view(np.uint8).reshape(-1, wb)
    return [np.ascontiguousarray(bytes2d[:, b]) for b in range(wb)]


def _unplanes(groups: list[Group], n: int, dtype: np.dtype) -> np.ndarray:
    wb = np.dtype(dtype).itemsize
    if len(groups) != 1 or groups[0].count != n or len(groups[0].streams) != wb:
        raise PackFormatError("dense chunk layout does not fit its tensor")
    _check_sizes(groups, n)
    out = np.empty((n, wb), np.uint8)
    for b, s in enumerate(groups[0].streams):
        plane = _decoded(s)
        if plane.size != n:
            raise PackFormatError("dense chunk plane has the wrong length")
        out[:, b] = plane
    return out.reshape(-1).view(dtype)


def _encode_planes(values: np.ndarray, level: int) -> bytes:
    return write_groups([Group(values.size, [_stream(p, level) for p in _planes(values)])])


def encode_dense_values(old, new, info: DtypeInfo, level: int) -> bytes:
    """A chunk of codec `dense_values`: byte planes of the new bit patterns."""
    return _encode_planes(new, level)


def encode_dense_residual(old, new, info: DtypeInfo, level: int) -> bytes:
    """A chunk of codec `dense_residual`: byte planes of the zigzag residual of every element."""
    _, _, signbit, wmask = consts(info)
    values = np.empty(new.size, info.uint_numpy)
    K.residual_all(old, new, signbit, wmask, values)
    return _encode_planes(values, level)


def decode_dense_values(old, chunk, info: DtypeInfo, n: int) -> np.ndarray:
    """The new bit patterns of every element of a `dense_values` chunk of n elements."""
    return _unplanes(read_groups(chunk), n, info.uint_numpy)


def decode_dense_residual(old, chunk, info: DtypeInfo, n: int) -> np.ndarray:
    """The new bit patterns of every element of a `dense_residual` chunk of n elements."""
    values = _unplanes(read_groups(chunk), n, info.uint_numpy)
    _, _, signbit, wmask = consts(info)
    out = np.empty(n, info.uint_numpy)
    K.apply_residual_all(old, values, signbit, wmask, out)
    return out
