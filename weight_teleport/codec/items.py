"""What every backend's `encode` takes and gives back (codec/backend.py): the items to
encode and the records and chunks made of them. Neutral ground: both backends use these,
neither imports the other."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from weight_teleport.codec import walks as W
from weight_teleport.codec.dtypes import DtypeInfo
from weight_teleport.codec.plan import chunk_ranges
from weight_teleport.format import TensorRecord


@dataclass
class EncodeItem:
    """One tensor (or walk over a box of one) to encode, as a backend holds it."""

    name: str
    info: DtypeInfo
    shape: tuple[int, ...]
    new: Any
    """The new bit patterns in the backend's form: a flat unsigned numpy array (CPU), a
    contiguous tensor of any dtype of their width on the device (CUDA)."""
    old: Any | None
    """The same of the base; None for snapshots."""
    cuts: list[int] | None = None
    """Elements of each chunk in walk order, where they are not the regular chunks of the
    pack's `chunk_elems` (a record cut at a receiver's slice bounds)."""
    chunk_digests: bool = False
    """Whether the record carries a digest per chunk (container version 2)."""

    def spans(self, numel: int, chunk_elems: int) -> list[tuple[int, int]]:
        """[start, stop) of each chunk in walk order, of an item of `numel` elements."""
        if self.cuts is None:
            return chunk_ranges(numel, chunk_elems)
        stops = [0]
        for n in self.cuts:
            stops.append(stops[-1] + n)
        return list(zip(stops[:-1], stops[1:]))


def walk_cuts(sl: W.TensorSlice, hint: W.Hint, numel: int, chunk_elems: int) -> list[int] | None:
    """The cuts of the record over the walk of the box `sl` that `hint` cuts (None: its
    chunks are the regular ones)."""
    spans = W.cut_spans(sl, hint, chunk_elems)
    return None if spans == chunk_ranges(numel, chunk_elems) else [e - s for s, e in spans]


class Encoded(NamedTuple):
    """What a backend's `encode` returns: the records (chunk offsets relative to `chunks`),
    the chunks' bytes, `ready()` (returns once the chunks hold their final bytes: the CUDA
    encoder's copies from the device may still run), and the stream codecs the chunks may
    name (the header's `stream_codecs`)."""

    records: list[TensorRecord]
    chunks: list
    ready: Callable[[], None]
    stream_codecs: list[str]
