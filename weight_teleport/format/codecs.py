"""The codecs a pack's record may name (docs/FORMAT.md), one line each.

A line is what the code knows of a codec by its name: what the container checks of its
records (`family`, `snapshot`) and what the class planner takes a class to cost. Plain
Python, so that the CLI's `--help` and the configs read the choices without loading numpy
or torch. A codec's name, once written in packs, never changes."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Codec:
    """One codec: its name in packs and its traits."""

    name: str
    family: str
    """"same": the record has no chunks (its tensor is unchanged). "dense": its chunks hold
    a value of every element in byte planes of raw or zstd streams (the container bounds
    the record's elements by its chunks' bytes). "sparse": its chunks hold class-coded
    events against the old weights (the record has `classes` and `inverted`); a user picks
    the codec of a delta's sparse records among these (`CHOICES`)."""
    snapshot: bool = False
    """Whether a snapshot's records may have it: a snapshot's receiver may hold no weights."""
    class_cost_bits: float = 0.0
    """Sparse codecs: what a class costs per chunk beyond its events' entropy, as the class
    planner takes it (codec/plan.py): it splits keys into another class only where the
    split saves more."""


CODECS: dict[str, Codec] = {c.name: c for c in (
    Codec("same", "same"),
    # four streams per class: their table entries and the Huffman table and frame of the
    # symbol streams come to about 50 bytes
    Codec("sparse", "sparse", class_cost_bits=400.0),
    # a class costs a varint or two of its chunk's table and what its adaptive contexts pay
    # to learn (on real training steps, packs shrink as this falls from 400 to about 60 and
    # stay flat below)
    Codec("sparse_ac", "sparse", class_cost_bits=60.0),
    Codec("dense_residual", "dense"),
    Codec("dense_values", "dense", snapshot=True),
)}
"""Every codec, by name. A delta's dense codecs are tried in this order (the first of two
equal sizes is kept)."""

DEFAULT = "sparse"
"""The codec of a delta's sparse records unless a user picks another: every reader stages
it, and the GPU's speed is measured on it (BENCHMARKS.md)."""
CHOICES = tuple(name for name, c in CODECS.items() if c.family == "sparse")
"""The codecs a user may pick for a delta's sparse records."""
DEPRECATED_CODERS = {"zstd": "sparse", "adaptive": "sparse_ac"}
"""`encode_delta`'s coders and the codec of their sparse records."""

