"""Tables that let one kernel launch cover the chunks of many tensors of one element type.

Tensors are addressed from one base tensor (the lowest address among them); a chunk's row
gives its element offset from the base, its length, its first element in its tensor, its
tensor's index (into per-tensor class tables) and its first program. A chunk is cut into
blocks of BLOCK elements, one program each, so no block straddles a chunk."""

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from weight_teleport.codec.cuda.runtime import memory
from weight_teleport.codec.cuda.live import flat_bits

OFF, LEN, START, TENSOR, PROG0 = range(5)
COLS = 5


@dataclass
class ChunkTable:
    base: torch.Tensor
    """Flat tensor at the lowest address; kernels add each row's OFF to its pointer."""
    rows: torch.Tensor
    """[chunks, COLS] int64 on the device."""
    host: np.ndarray
    """The same rows on the host."""
    program_chunk: torch.Tensor
    """Chunk of every program (int32, on the device)."""
    program_tensor: torch.Tensor
    """Tensor of every program (int64, on the device)."""
    block: int
    """Elements of one program's block."""
    tensors: int
    """Tensors the table was built from (empty ones have no chunks)."""

    @property
    def programs(self) -> int:
        return self.program_chunk.numel()

    @property
    def chunks(self) -> int:
        return self.host.shape[0]

    def per_tensor(self, rows: torch.Tensor) -> torch.Tensor:
        """[tensors, ...] int64 sums (mod 2^64) of per-program integer rows ([programs, ...]),
        in one launch: a program adds up a run of rows, with one atomic add per column where
        the run lies in one tensor (a tensor's programs are consecutive). index_add_ takes an
        atomic per row and column, and with millions of programs over a few hundred tensors
        its adds serialise on a few addresses."""
        assert not rows.dtype.is_floating_point
        flat = rows[: self.programs].reshape(self.programs, -1).contiguous()
        k = flat.shape[1]
        out = torch.zeros((self.tensors, k), dtype=torch.int64, device=rows.device)
        if self.programs and k:
            kb = min(64, triton.next_power_of_2(k))
            g = max(16, 4096 // kb)
            _per_tensor_kernel[(triton.cdiv(self.programs, g), triton.cdiv(k, kb))](
                flat, self.program_tensor, out, self.programs, k, G=g, KB=kb
            )
        return out.view(self.tensors, *rows.shape[1:])


@triton.jit
def _per_tensor_kernel(rows_ptr, tensor_ptr, out_ptr, programs, k, G: tl.constexpr, KB: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
    live = r < programs
    t = tl.load(tensor_ptr + r, mask=live, other=0)
    c = tl.program_id(1) * KB + tl.arange(0, KB)
    cols = c < k
    x = tl.load(rows_ptr + r[:, None] * k + c[None, :], mask=live[:, None] & cols[None, :], other=0).to(tl.int64)
    lo = tl.min(tl.where(live, t, programs))
    hi = tl.max(tl.where(live, t, -1))
    if lo == hi:  # the run lies in one tensor
        tl.atomic_add(out_ptr + lo * k + c, tl.sum(x, 0), mask=cols, sem="relaxed")
    else:
        tl.atomic_add(out_ptr + t[:, None] * k + c[None, :], x, mask=live[:, None] & cols[None, :], sem="relaxed")


def chunk_rows(numels: np.ndarray, chunk_elems: int, cuts=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tensor of each chunk, first element of each chunk in its tensor, its length): chunks
    of `chunk_elems`, or where `cuts[i]` is given (a record's `cuts`, which read_header has
    checked to add up to its elements) the chunks of tensor i it lists."""
    tensor, chunk = memory.items(-(-numels // chunk_elems))
    start = chunk * chunk_elems
    length = np.minimum(numels[tensor] - start, chunk_elems)
    if cuts is None or not any(cuts):
        return tensor, start, length
    lengths = [np.asarray(c, np.int64) if c else length[tensor == i] for i, c in enumerate(cuts)]
    length = np.concatenate(lengths) if lengths else length
    tensor = np.repeat(np.arange(len(lengths)), [x.size for x in lengths])
    return tensor, _starts_within(tensor, length), length


def _starts_within(tensor: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Each chunk's first element in its tensor, from the lengths of every tensor's chunks."""
    ends = np.cumsum(length)
    first = np.searchsorted(tensor, tensor, side="left")  # each chunk's tensor's first chunk
    return ends - length - (ends - length)[first]


def _elements_from_base(flats: list[torch.Tensor]) -> tuple[np.ndarray, int]:
    """(each tensor's first element counted from the lowest-addressed tensor's, the index of
    that tensor) of flat tensors of one element type."""
    size = flats[0].element_size()
    ptrs = np.array([t.data_ptr() for t in flats], np.int64)
    base = int(np.argmin(ptrs))
    assert ((ptrs - ptrs[base]) % size == 0).all()
    return (ptrs - ptrs[base]) // size, base


def build(flats: list[torch.Tensor], chunk_elems: int, block: int, info=None, cuts=None, origins=None) -> ChunkTable:
    """The chunk table of the contiguous tensors `flats` (one element size, one device), of
    which only pointers and sizes are read; its base is the lowest-addressed one as given,
    or its flat bit patterns of element type `info` (a DtypeInfo) when given. `cuts`: per
    tensor, its chunks' lengths, or None for chunks of `chunk_elems` (`chunk_rows`).
    `origins`: per tensor, where its first element lies in its record's walk (None: 0
    each), added to the chunks' START, which numbers the digest's words; OFF alone
    addresses memory."""
    elem, base = _elements_from_base(flats)
    tensor, start, length = chunk_rows(np.array([t.numel() for t in flats], np.int64), chunk_elems, cuts)
    progs = -(-length // block)
    at = start if origins is None else start + np.asarray(origins, np.int64)[tensor]
    rows = np.stack([elem[tensor] + start, length, at, tensor, memory.starts(progs)], axis=1).astype(np.int64)
    dev = flats[0].device
    rows_d, progs_d = memory.to_device([rows, progs], dev)
    prog_chunk = torch.repeat_interleave(
        torch.arange(rows.shape[0], dtype=torch.int32, device=dev), progs_d, output_size=int(progs.sum())
    )
    return ChunkTable(
        _base(flats[base], info), rows_d, rows, prog_chunk, rows_d[prog_chunk.long(), TENSOR], block, len(flats)
    )


CACHED = 8
"""Chunk tables `build_cached` keeps (a sampler's batches, one per element type; a trainer's
two per element type, the scan's and the events'). A table holds 12 bytes of device memory
a block (about 3 MB per GB of bf16 weights at 2048-element blocks), so the cache stays small."""
_cached: dict = {}


def build_cached(
    flats: list[torch.Tensor], chunk_elems: int, block: int, info=None, cuts=None, origins=None
) -> ChunkTable:
    """`build`, reusing a table built before for the same pointers and sizes (a sampler
    stages every version onto the same weights, a trainer keeps its published weights in
    the same memory), of which a table reads nothing else; only its base is made anew.
    The stage's host path before the decompression's launch is its first link, and building
    a table is a millisecond-scale part of it for a large state."""
    key = (
        flats[0].device,
        flats[0].dtype,
        chunk_elems,
        block,
        None if info is None else info.name,
        tuple((t.data_ptr(), t.numel()) for t in flats),
        None if cuts is None or not any(cuts) else tuple(tuple(c) if c else None for c in cuts),
        None if origins is None or not any(origins) else tuple(origins),
    )
    if key not in _cached:
        if len(_cached) >= CACHED:
            _cached.clear()
        table = build(flats, chunk_elems, block, info, cuts, origins)
        # cached without its tensor (not kept alive here): a hit sets `base` again
        _cached[key] = dataclasses.replace(table, base=None), _elements_from_base(flats)[1]  # type: ignore[arg-type]
        return table
    table, base = _cached[key]
    return dataclasses.replace(table, base=_base(flats[base], info))


def _base(tensor: torch.Tensor, info) -> torch.Tensor:
    return tensor if info is None else flat_bits(tensor, info)


@dataclass
class Paired:
    """Tensors of the same shapes as a chunk table's (the new weights beside the old), read
    through the table's rows with their own chunk offsets."""

    base: torch.Tensor
    """Flat tensor at the lowest address among them."""
    offsets: torch.Tensor
    """[chunks] int64: each chunk's first element from `base` (device)."""


_paired: dict = {}


def pair(flats: list[torch.Tensor], table: ChunkTable, info=None) -> Paired:
    """The contiguous tensors `flats`, one per tensor of `table` and of the same sizes, as a
    Paired (its base as in `build`). The offsets are reused for the same pointers and a
    table from `build_cached`'s same entry (its host rows, which the cache holds, so that
    their identity is not taken by another table's): made anew, the scan's and the events'
    pairs lie on the encoder's host path before their launches."""
    key = (id(table.host), flats[0].device, tuple(t.data_ptr() for t in flats))
    if key not in _paired:
        if len(_paired) >= CACHED:
            _paired.clear()
        elem, base = _elements_from_base(flats)
        off = elem[table.host[:, TENSOR]] + table.host[:, START]
        _paired[key] = table.host, memory.to_device([off], flats[0].device)[0], base
    _, offsets, base = _paired[key]
    return Paired(_base(flats[base], info), offsets)
