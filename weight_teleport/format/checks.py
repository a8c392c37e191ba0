"""The header's rules (docs/FORMAT.md), checked by `read_header` before anything is
allocated from a header's numbers: a record's fields, its chunks against the payload that
holds them, and the limits of `PackLimits`. Checks over all chunks run at once (numpy);
the few a record needs run in one loop over the records."""

import itertools
import math
import re
from typing import TYPE_CHECKING

import numpy as np

from weight_teleport.errors import PackFormatError, UnsupportedFormatError
from weight_teleport.format.limits import MAX_CHUNK_ELEMS, ZSTD_MAX_EXPANSION, PackLimits, over_limit

if TYPE_CHECKING:
    from weight_teleport.format.container import PackHeader

KINDS = ("delta", "snapshot")
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
"""The dtypes of the format, and the bytes of an element of each."""
CODECS = ("same", "sparse", "dense_residual", "dense_values")
SNAPSHOT_CODECS = ("dense_values",)
"""A snapshot holds every element of every tensor: the other codecs patch weights a
receiver already has, and a snapshot's receiver may have none."""
DENSE_CODECS = ("dense_residual", "dense_values")
_DIGESTS = re.compile(r"[0-9a-f]*")


def check_layout(h: "PackHeader", limits: PackLimits) -> None:
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
    # the chunks inside the payload, their CRC-32s in range: over all chunks at once (with a
    # loop over the 1,954 chunks of the Qwen3-8B-shaped delta, this check took 0.7-0.8 ms on
    # the H200's host)
    if h.chunk_rows is None or not chunks_fit(h.chunk_rows, h.payload_length):
        check_chunks_one_by_one(h)
        raise PackFormatError("pack header has a malformed chunk table")  # not reached: the loop raises
    _check_dense_sizes(h, dense_bytes)


def _check_pack_fields(h: "PackHeader") -> None:
    if h.kind not in KINDS:
        raise PackFormatError(f"unknown pack kind {h.kind!r}")
    if (h.kind == "delta") != (h.base_version is not None):
        raise PackFormatError(f"a {h.kind} pack with base_version {h.base_version!r}: a delta names its base "
                              "version, a snapshot has none")
    if h.chunk_elems <= 0 or h.chunk_elems % 8 or h.chunk_elems > MAX_CHUNK_ELEMS:
        raise PackFormatError(f"chunk_elems {h.chunk_elems} must be a positive multiple of 8, at most "
                              f"{MAX_CHUNK_ELEMS}")


def _check_records(h: "PackHeader", limits: PackLimits) -> tuple[list[int], list[int]]:
    """(chunks of each record, bytes of each dense record's elements (0 for the others))."""
    names, counts, dense_bytes = set(), [], []
    snapshot, max_numel = h.kind == "snapshot", limits.max_numel
    for t in h.tensors:
        if t.name in names:
            raise PackFormatError(f"tensor {t.name!r} appears twice in the pack")
        names.add(t.name)
        width = DTYPE_BYTES.get(t.dtype)
        if width is None:
            raise UnsupportedFormatError(f"tensor {t.name!r} has dtype {t.dtype!r}, which this build does not "
                                         f"know ({', '.join(DTYPE_BYTES)}); upgrade weight-teleport to read it")
        if t.codec not in CODECS:
            raise UnsupportedFormatError(f"tensor {t.name!r} has codec {t.codec!r}, which this build does not "
                                         f"know ({', '.join(CODECS)}); upgrade weight-teleport to read it")
        if snapshot and t.codec not in SNAPSHOT_CODECS:
            raise PackFormatError(f"tensor {t.name!r} of a snapshot has codec {t.codec!r}: a snapshot holds "
                                  f"every element ({', '.join(SNAPSHOT_CODECS)})")
        numel = _numel(t, max_numel)
        if not 0 <= t.changed <= numel:
            raise PackFormatError(f"tensor {t.name!r} claims {t.changed} changed elements of {numel}")
        if not snapshot and t.base_digest is None:
            raise PackFormatError(f"tensor {t.name!r} of a delta has no base_digest")
        n_chunks = 0 if t.codec == "same" else -(-numel // h.chunk_elems)
        if len(t.chunks) != n_chunks:
            raise PackFormatError(f"tensor {t.name!r} has {len(t.chunks)} chunks, expected {n_chunks}")
        counts.append(n_chunks)
        dense_bytes.append(numel * width if t.codec in DENSE_CODECS else 0)
    return counts, dense_bytes


def _numel(t, max_numel: int) -> int:
    """The elements of record `t`, within `max_numel` (and each dimension too)."""
    if t.shape and min(t.shape) < 0:
        raise PackFormatError(f"tensor {t.name!r} has a negative dimension: shape {list(t.shape)}")
    if t.shape and max(t.shape) > max_numel:
        raise over_limit(f"tensor {t.name!r} dimension", max(t.shape), max_numel, "max_numel")
    numel = math.prod(t.shape)
    if numel > max_numel:
        raise over_limit(f"tensor {t.name!r} elements", numel, max_numel, "max_numel")
    return numel


def _check_digests(h: "PackHeader") -> None:
    """Every digest (and a delta's every base digest) is 16 lowercase hex digits."""
    fields = [("digest", t.digest) for t in h.tensors]
    if h.kind == "delta":
        fields += [("base_digest", t.base_digest) for t in h.tensors]
    joined = "".join(text for _, text in fields)
    if len(joined) == 16 * len(fields) and _DIGESTS.fullmatch(joined):
        return
    for (what, text), t in zip(fields, itertools.cycle(h.tensors)):
        if len(text) != 16 or not _DIGESTS.fullmatch(text):
            raise PackFormatError(f"tensor {t.name!r} has {what} {text[:40]!r}, not 16 lowercase hex digits")


def chunks_fit(rows: np.ndarray, payload_length: int) -> bool:
    """Whether every chunk of `rows` ([n, 3] offset, length, CRC-32) is a non-empty range of
    the payload with a 32-bit CRC, and all of them together are no longer than the payload."""
    off, length, crc = rows.T
    bad = (off < 0) | (length < 1) | (length > payload_length - off) | (crc < 0) | (crc > 0xFFFFFFFF)
    return not bad.any() and int(length.sum()) <= payload_length  # int64: each length is at most a payload in memory


def check_chunks_one_by_one(h: "PackHeader") -> None:
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
        raise PackFormatError(f"pack chunks hold {total} bytes together, more than the payload's "
                              f"{h.payload_length}: chunks overlap")


def _check_dense_sizes(h: "PackHeader", dense_bytes: list[int]) -> None:
    """A dense record's elements come from its chunks' streams, raw or zstd: at most
    ZSTD_MAX_EXPANSION bytes a stored byte. (A tiny pack that declares a huge dense tensor
    is refused here, before a receiver with no weights allocates it.)"""
    ends = np.concatenate([[0], np.cumsum(h.chunk_rows[:, 1])])
    stored = ends[h.chunk_first[1:]] - ends[h.chunk_first[:-1]]
    need = np.array(dense_bytes, np.int64)  # below 2^59: 8-byte elements, max_numel below 2^56
    bad = np.flatnonzero(-(-need // ZSTD_MAX_EXPANSION) > stored)
    if bad.size:
        t = h.tensors[int(bad[0])]
        raise PackFormatError(f"tensor {t.name!r} needs {int(need[bad[0]])} bytes, more than its "
                              f"{int(stored[bad[0]])} stored bytes can hold")
