"""Tables that let one kernel launch cover the chunks of many tensors of one element type.

Tensors are addressed from one base tensor (the lowest address among them); a chunk's row
gives its element offset from the base, its length, its first element in its tensor, its
tensor's index (into per-tensor class tables) and its first program. A chunk is cut into
blocks of BLOCK elements, one program each, so no block straddles a chunk."""

from dataclasses import dataclass

import numpy as np
import torch

from weight_teleport.codec.cuda import layout

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
        """[tensors, ...] sums of per-program rows (integer atomics: exact in any order)."""
        out = torch.zeros((self.tensors, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        return out.index_add_(0, self.program_tensor, rows[:self.programs])


def chunk_rows(numels: np.ndarray, chunk_elems: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tensor of each chunk, first element of each chunk in its tensor, its length)."""
    tensor, chunk = layout.items(-(-numels // chunk_elems))
    start = chunk * chunk_elems
    return tensor, start, np.minimum(numels[tensor] - start, chunk_elems)


def _elements_from_base(flats: list[torch.Tensor]) -> tuple[np.ndarray, int]:
    """(each tensor's first element counted from the lowest-addressed tensor's, the index of
    that tensor) of flat tensors of one element type."""
    size = flats[0].element_size()
    ptrs = np.array([t.data_ptr() for t in flats], np.int64)
    base = int(np.argmin(ptrs))
    assert ((ptrs - ptrs[base]) % size == 0).all()
    return (ptrs - ptrs[base]) // size, base


def build(flats: list[torch.Tensor], chunk_elems: int, block: int) -> ChunkTable:
    """The chunk table of the flat contiguous tensors `flats` (one element type, one device)."""
    elem, base = _elements_from_base(flats)
    tensor, start, length = chunk_rows(np.array([t.numel() for t in flats], np.int64), chunk_elems)
    progs = -(-length // block)
    rows = np.stack([elem[tensor] + start, length, start, tensor, layout.starts(progs)], axis=1).astype(np.int64)
    dev = flats[0].device
    rows_d, progs_d = layout.to_device([rows, progs], dev)
    prog_chunk = torch.repeat_interleave(torch.arange(rows.shape[0], dtype=torch.int32, device=dev), progs_d,
                                         output_size=int(progs.sum()))
    return ChunkTable(flats[base], rows_d, rows, prog_chunk, rows_d[prog_chunk.long(), TENSOR], block, len(flats))


@dataclass
class Paired:
    """Tensors of the same shapes as a chunk table's (the new weights beside the old), read
    through the table's rows with their own chunk offsets."""
    base: torch.Tensor
    """Flat tensor at the lowest address among them."""
    offsets: torch.Tensor
    """[chunks] int64: each chunk's first element from `base` (device)."""


def pair(flats: list[torch.Tensor], table: ChunkTable) -> Paired:
    """The tensors `flats`, one per tensor of `table` and of the same sizes, as a Paired."""
    elem, base = _elements_from_base(flats)
    off = elem[table.host[:, TENSOR]] + table.host[:, START]
    return Paired(flats[base], layout.to_device([off], flats[0].device)[0])
