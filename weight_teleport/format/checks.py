"""The header's rules (docs/FORMAT.md), checked by `read_header` before anything is
allocated from a header's numbers: a record's fields, its chunks against the payload that
holds them, and the limits of `PackLimits`. Checks over all chunks run at once (numpy);
the few a record needs run in one loop over the records."""

import itertools
import math
from typing import NoReturn

import numpy as np

from weight_teleport.errors import PackFormatError, UnsupportedFormatError
from weight_teleport.format.codecs import CODECS as _REGISTRY
from weight_teleport.format.header import PackHeader
from weight_teleport.format.limits import MAX_CHUNK_ELEMS, ZSTD_MAX_EXPANSION, PackLimits, over_limit


KINDS = ("delta", "snapshot")
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
"""The dtypes of the format, and the bytes of an element of each."""
CODECS = tuple(_REGISTRY)
"""The codec names a record may have (format/codecs.py)."""
SNAPSHOT_CODECS = tuple(name for name, c in _REGISTRY.items() if c.snapshot)
"""A snapshot holds every element of every tensor: the other codecs patch weights a
receiver already has, and a snapshot's receiver may have none."""
DENSE_CODECS = tuple(name for name, c in _REGISTRY.items() if c.family == "dense")
_CODECS, _SNAPSHOT, _DENSE = frozenset(CODECS), frozenset(SNAPSHOT_CODECS), frozenset(DENSE_CODECS)
_NO_CHUNKS = frozenset(name for name, c in _REGISTRY.items() if c.family == "same")
_HEX_DIGITS = b"0123456789abcdef"


def check_layout(h: PackHeader, limits: PackLimits) -> None:
    """PackFormatError (or UnsupportedFormatError, PackLimitError) for the first rule `h`
    breaks; sets `h.chunk_rows` and `h.chunk_first`."""
    _check_pack_fields(h)
    counts, dense_bytes = _check_records(h, limits)
    _check_digests(h)
    h.chunk_first = np.zeros(len(h.tensors) + 1, np.int64)
    np.cumsum(counts, out=h.chunk_first[1:])
    n = int(h.chunk_first[-1])
    if n > h.payload_length:  # every chunk holds a byte at least: refused before its rows are made
        raise PackFormatError(f"pack header lists {n} chunks, its payload of {h.payload_length} bytes cannot hold them")
    refs = itertools.chain.from_iterable(itertools.chain.from_iterable(t.chunks for t in h.tensors))
    try:
        h.chunk_rows = np.fromiter(refs, np.int64, 3 * n).reshape(n, 3)
    except OverflowError:  # a number past int64, which no chunk that fits the payload holds
        h.chunk_rows = None
    # the chunks inside the payload, their CRC-32s in range: over all chunks at once (a loop
    # over a large model's thousands of chunks would sit on every stage's host path)
    if h.chunk_rows is None or not chunks_fit(h.chunk_rows, h.payload_length):
        check_chunks_one_by_one(h)
        raise PackFormatError("pack header has a malformed chunk table")  # not reached: the loop raises
    _check_dense_sizes(h, dense_bytes)


def _check_pack_fields(h: PackHeader) -> None:
    if h.kind not in KINDS:
        raise PackFormatError(f"unknown pack kind {h.kind!r}")
    if (h.kind == "delta") != (h.base_version is not None):
        raise PackFormatError(
            f"a {h.kind} pack with base_version {h.base_version!r}: a delta names its base version, a snapshot has none"
        )
    if h.chunk_elems <= 0 or h.chunk_elems % 8 or h.chunk_elems > MAX_CHUNK_ELEMS:
        raise PackFormatError(
            f"chunk_elems {h.chunk_elems} must be a positive multiple of 8, at most {MAX_CHUNK_ELEMS}"
        )


def _check_records(h: PackHeader, limits: PackLimits) -> tuple[list[int], list[int]]:
    """(chunks of each record, bytes of each dense record's elements (0 for the others)). One
    lean loop: a header holds hundreds to thousands of records."""
    names, counts, dense_bytes = set(), [], []
    snapshot, max_numel, chunk_elems = h.kind == "snapshot", limits.max_numel, h.chunk_elems
    for t in h.tensors:
        shape, codec = t.shape, t.codec
        if t.name in names:
            raise PackFormatError(f"tensor {t.name!r} appears twice in the pack")
        names.add(t.name)
        width = DTYPE_BYTES.get(t.dtype)
        if width is None or codec not in _CODECS or (snapshot and codec not in _SNAPSHOT):
            _refuse_names(t, snapshot)
        # dimensions and `changed` are non-negative (msgspec checked them); a dimension is at
        # most the elements unless another is 0
        numel = math.prod(shape) if len(shape) <= 8 else _capped_prod(shape, max_numel)
        if numel > max_numel or (numel == 0 and shape and max(shape) > max_numel):
            _refuse_shape(t, max_numel)
        if not snapshot and t.base_digest is None:
            raise PackFormatError(f"tensor {t.name!r} of a delta has no base_digest")
        if t.box is not None or t.order is not None or t.cuts or t.chunk_digests or t.chunk_base_digests:
            numel = check_v2_record(t, h, limits)
        if t.changed > numel:
            raise PackFormatError(f"tensor {t.name!r} claims {t.changed} changed elements of {numel}")
        n_chunks = 0 if codec in _NO_CHUNKS else len(t.cuts) if t.cuts else -(-numel // chunk_elems)
        if len(t.chunks) != n_chunks:
            raise PackFormatError(f"tensor {t.name!r} has {len(t.chunks)} chunks, expected {n_chunks}")
        counts.append(n_chunks)
        dense_bytes.append(numel * width if codec in _DENSE else 0)
    return counts, dense_bytes


ORDERS = ("rows", "cols")
"""Walk orders of a record over its box (docs/FORMAT.md, "Records over boxes")."""


def check_v2_record(t, h: PackHeader, limits: PackLimits) -> int:
    """PackFormatError for the first rule of version 2 that record `t` breaks (its box, walk
    order, cuts and chunk digests); returns the record's elements."""
    if h.format_version < 2:
        raise PackFormatError(f"tensor {t.name!r} has fields of format version 2 in a version {h.format_version} pack")
    if t.order is not None and t.order not in ORDERS:
        raise UnsupportedFormatError(
            f"tensor {t.name!r} has walk order {t.order[:40]!r}, which this build "
            f"does not know ({', '.join(ORDERS)}); upgrade weight-teleport to read it"
        )
    if t.box is not None:  # checked before its elements are counted: then at most the shape's
        if len(t.box) != len(t.shape):
            raise PackFormatError(
                f"tensor {t.name!r} has a box of {len(t.box)} dimensions, its shape has {len(t.shape)}"
            )
        if any(o + e > d for (o, e), d in zip(t.box, t.shape)):
            raise PackFormatError(
                f"tensor {t.name!r} has box {str(t.box)[:200]} outside its shape {str(list(t.shape))[:200]}"
            )
    numel = _capped_prod([e for _, e in t.box], limits.max_numel) if t.box is not None else t.numel
    if t.cuts:
        _check_cuts(t, numel)
    n_chunks = len(t.cuts) if t.cuts else (0 if t.codec in _NO_CHUNKS else -(-numel // h.chunk_elems))
    _check_chunk_digests(t, t.chunk_digests, t.digest, "chunk_digests", n_chunks)
    if h.kind == "delta":
        if bool(t.chunk_base_digests) != bool(t.chunk_digests):
            raise PackFormatError(
                f"tensor {t.name!r} of a delta has chunk_digests and chunk_base_digests only together"
            )
        _check_chunk_digests(t, t.chunk_base_digests, t.base_digest, "chunk_base_digests", n_chunks)
    elif t.chunk_base_digests:
        raise PackFormatError(f"tensor {t.name!r} of a snapshot has chunk_base_digests")
    return numel


def _check_cuts(t, numel: int) -> None:
    cuts = t.cuts
    if t.codec in _NO_CHUNKS:
        raise PackFormatError(f"tensor {t.name!r} has codec {t.codec!r} and cuts: it has no chunks")
    if any(type(c) is not int or not 1 <= c <= MAX_CHUNK_ELEMS for c in cuts):
        raise PackFormatError(f"tensor {t.name!r} has a cut outside [1, {MAX_CHUNK_ELEMS}]")
    if any(c % 8 for c in cuts[:-1]):
        raise PackFormatError(
            f"tensor {t.name!r} has a chunk of a number of elements not a multiple of 8 before its last"
        )
    if sum(cuts) != numel:
        raise PackFormatError(f"tensor {t.name!r} has cuts adding up to {sum(cuts)} elements, its record has {numel}")


def _check_chunk_digests(t, digests: list, total: str | None, what: str, n_chunks: int) -> None:
    """Chunk digests, where a record has them: one a chunk, 16 lowercase hex digits each,
    adding up to the record's digest `total` mod 2^64."""
    if not digests:
        return
    if len(digests) != n_chunks:
        raise PackFormatError(f"tensor {t.name!r} has {len(digests)} {what} for {n_chunks} chunks")
    joined = "".join(digests).encode()
    if len(joined) != 16 * len(digests) or joined.translate(None, _HEX_DIGITS):
        raise PackFormatError(f"tensor {t.name!r} has {what} that are not 16 lowercase hex digits each")
    if (
        total is not None
        and len(total) == 16
        and not total.encode().translate(None, _HEX_DIGITS)
        and sum(int(d, 16) for d in digests) % (1 << 64) != int(total, 16)
    ):
        raise PackFormatError(f"tensor {t.name!r}: its {what} do not add up to its record's digest")


def _refuse_names(t, snapshot: bool) -> NoReturn:
    """The error for a record whose dtype or codec is unknown, or whose codec a snapshot
    cannot hold."""
    if t.dtype not in DTYPE_BYTES:
        raise UnsupportedFormatError(
            f"tensor {t.name!r} has dtype {t.dtype!r}, which this build does not "
            f"know ({', '.join(DTYPE_BYTES)}); upgrade weight-teleport to read it"
        )
    if t.codec not in CODECS:
        raise UnsupportedFormatError(
            f"tensor {t.name!r} has codec {t.codec!r}, which this build does not "
            f"know ({', '.join(CODECS)}); upgrade weight-teleport to read it"
        )
    raise PackFormatError(
        f"tensor {t.name!r} of a snapshot has codec {t.codec!r}: a snapshot holds "
        f"every element ({', '.join(SNAPSHOT_CODECS)})"
    )


def _capped_prod(shape, cap: int) -> int:
    """The product of non-negative dimensions, or cap + 1 once it passes cap (a shape of many
    dimensions would otherwise multiply huge integers)."""
    n = 1
    for s in shape:
        n *= s
        if n > cap:
            return 0 if 0 in shape else cap + 1
    return n


def _refuse_shape(t, max_numel: int) -> NoReturn:
    """The error for a record past `max_numel`."""
    if max(t.shape) > max_numel:
        raise over_limit(f"tensor {t.name!r} dimension", max(t.shape), max_numel, "max_numel")
    raise over_limit(f"tensor {t.name!r} elements (at least)", _capped_prod(t.shape, max_numel), max_numel, "max_numel")


def _check_digests(h: PackHeader) -> None:
    """Every digest (and a delta's every base digest) is 16 lowercase hex digits: checked on
    all of them joined (no hex digit left once they are deleted), then one by one for the
    message."""
    fields = [("digest", t.digest) for t in h.tensors]
    if h.kind == "delta":
        # each set: _check_records refused a delta's record without one
        fields += [("base_digest", t.base_digest or "") for t in h.tensors]
    joined = "".join(text for _, text in fields).encode()
    if len(joined) == 16 * len(fields) and not joined.translate(None, _HEX_DIGITS):
        return
    for (what, text), t in zip(fields, itertools.cycle(h.tensors)):
        if len(text) != 16 or text.encode().translate(None, _HEX_DIGITS):
            raise PackFormatError(f"tensor {t.name!r} has {what} {text[:40]!r}, not 16 lowercase hex digits")


def chunks_fit(rows: np.ndarray, payload_length: int) -> bool:
    """Whether every chunk of `rows` ([n, 3] offset, length, CRC-32) is a non-empty range of
    the payload with a 32-bit CRC, and all of them together are no longer than the payload."""
    off, length, crc = rows.T
    bad = (off < 0) | (length < 1) | (length > payload_length - off) | (crc < 0) | (crc > 0xFFFFFFFF)
    return not bad.any() and int(length.sum()) <= payload_length  # int64: each length is at most a payload in memory


def check_chunks_one_by_one(h: PackHeader) -> None:
    """PackFormatError for the first chunk outside the payload, empty or with a CRC-32 out of
    range, or for chunks longer together than the payload (`chunks_fit` has found one)."""
    total = 0
    for t in h.tensors:
        for offset, length, crc in t.chunks:
            if offset < 0 or length < 1 or offset + length > h.payload_length:
                raise PackFormatError(f"tensor {t.name!r} has a chunk outside the payload or empty")
            if not 0 <= crc <= 0xFFFFFFFF:
                raise PackFormatError(f"tensor {t.name!r} has a chunk CRC-32 out of range ({crc})")
            total += length
    if total > h.payload_length:
        raise PackFormatError(
            f"pack chunks hold {total} bytes together, more than the payload's {h.payload_length}: chunks overlap"
        )


def _check_dense_sizes(h: PackHeader, dense_bytes: list[int]) -> None:
    """A dense record's elements come from its chunks' streams, raw or zstd: at most
    ZSTD_MAX_EXPANSION bytes a stored byte. (A tiny pack that declares a huge dense tensor
    is refused here, before a receiver with no weights allocates it.)"""
    assert h.chunk_rows is not None and h.chunk_first is not None  # check_layout set them
    ends = np.concatenate([[0], np.cumsum(h.chunk_rows[:, 1])])
    stored = ends[h.chunk_first[1:]] - ends[h.chunk_first[:-1]]
    need = np.array(dense_bytes, np.int64)  # below 2^59: 8-byte elements, max_numel below 2^56
    bad = np.flatnonzero(-(-need // ZSTD_MAX_EXPANSION) > stored)
    if bad.size:
        t = h.tensors[int(bad[0])]
        raise PackFormatError(
            f"tensor {t.name!r} needs {int(need[bad[0]])} bytes, more than its "
            f"{int(stored[bad[0]])} stored bytes can hold"
        )
