"""The codec registry: every codec a pack's record may name (docs/FORMAT.md), one line each.

A line is all that the code knows of a codec by its name: what the container checks of
its records (`family`, `snapshot`), what the class planner takes a class to cost, and
where each backend's encoder and stager live, as "module:name" relative to
`weight_teleport.codec`, imported on first use by `codec/registry.py`. The format reads
this table and imports no codec code; plain Python, so that the CLI's `--help` and the
configs read the choices without loading numpy or torch.

A codec has one name everywhere: in packs (a name, once written, never changes), in
`encode_delta(codec=...)`, `PublisherConfig.codec`, `weight-teleport publish --codec`
and the docs."""

from dataclasses import dataclass
from typing import Final, Literal


@dataclass(frozen=True)
class Codec:
    """One codec: its name in packs, its traits, and its encoder and stager per backend."""

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
    cpu: tuple[str, str] | None = None
    """The CPU backend's chunk encoder and decoder. Sparse: `encode(old, new, info, plan,
    total, changed, level) -> bytes` and `decode(old, chunk, info, lut, inverted) ->
    (positions, values)` (codec/cpu/chunks.py has what they build on); dense: `encode(old,
    new, info, level)` and `decode(old, chunk, info, n) -> values`."""
    cuda: tuple[str, str] | None = None
    """The CUDA backend's encoder of a batch's events, `encode(events, config, level,
    threads, room) -> cuda.encode.sparse.Encoded`, and stager, `Stage(lives, recs,
    header, pack, threads, config)` (cuda/stage/staging.py says what it does). None: the
    CUDA backend codes and stages these records through the CPU backend's."""


CODECS: dict[str, Codec] = {
    c.name: c
    for c in (
        Codec("same", "same"),
        # four streams per class: their table entries and the Huffman table and frame of the
        # symbol streams come to about 50 bytes
        Codec(
            "sparse",
            "sparse",
            class_cost_bits=400.0,
            cpu=(".cpu.chunks:encode_sparse", ".cpu.chunks:decode_sparse"),
            cuda=(".cuda.encode.sparse:encode", ".cuda.stage.staging:SparseStage"),
        ),
        # a class costs a varint or two of its chunk's table and what its adaptive contexts pay
        # to learn (on real training steps, packs shrink as this falls from 400 to about 60 and
        # stay flat below)
        Codec(
            "sparse_ac",
            "sparse",
            class_cost_bits=60.0,
            cpu=(".cpu.adaptive:encode_chunk", ".cpu.adaptive:decode_chunk"),
            cuda=(".cuda.encode.adaptive:encode", ".cuda.stage.adaptive:AdaptiveStage"),
        ),
        Codec(
            "dense_residual", "dense", cpu=(".cpu.chunks:encode_dense_residual", ".cpu.chunks:decode_dense_residual")
        ),
        Codec(
            "dense_values",
            "dense",
            snapshot=True,
            cpu=(".cpu.chunks:encode_dense_values", ".cpu.chunks:decode_dense_values"),
        ),
    )
}
"""Every codec, by name. A delta's dense codecs are tried in this order (the first of two
equal sizes is kept)."""

DEFAULT: Final = "sparse"
"""The codec of a delta's sparse records unless a user picks another: every reader stages
it, and the GPU's speed is measured on it (BENCHMARKS.md)."""
AUTO: Final = "auto"
"""The choice that picks a codec per record (`pick`): no codec of its own, never in a pack."""
AUTO_AC_MAX_DENSITY = 0.01
"""`auto` codes a record with `sparse_ac` where at most this share of its elements changed,
and with `sparse` above. Below it `sparse_ac`'s packs are smaller and decode at least as fast
on the CPU; above it `sparse_ac` encodes slower for a few percent fewer bytes (BENCHMARKS.md,
real steps). On a GPU `sparse_ac` encodes and stages several times slower than `sparse` at
every density (one serial coder per chunk), which keeps `auto` from being the default."""
CHOICES = (*(name for name, c in CODECS.items() if c.family == "sparse"), AUTO)
"""What a user may pick for a delta's sparse records: a sparse codec, or `auto`."""
Choice = Literal["sparse", "sparse_ac", "auto"]
"""CHOICES as the type checkers read it (`PublisherConfig.codec`; a test holds the two equal)."""
DEPRECATED_CODERS = {"zstd": "sparse", "adaptive": "sparse_ac"}
"""The choice's old spelling (`coder=...`, `--coder`) and the codec each meant, still
accepted with a warning."""


def pick(choice: str, changed: int, numel: int) -> str:
    """The sparse codec of a record of `numel` elements of which `changed` changed, given a
    user's choice (`CHOICES`): the codec chosen, or for `auto` the one `AUTO_AC_MAX_DENSITY`
    says. The rule is one function of the counts: every backend writes the same packs."""
    if choice != AUTO:
        return choice
    return "sparse_ac" if changed <= AUTO_AC_MAX_DENSITY * numel else "sparse"


def picks(choice: str) -> tuple[str, ...]:
    """The sparse codecs `choice` may pick."""
    return tuple(c for c in CHOICES if c != AUTO) if choice == AUTO else (choice,)
