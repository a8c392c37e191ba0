"""Where vLLM's tensor-parallel workers keep each checkpoint tensor, computed from the model
config alone (plain Python: no torch, no engine).

Two products:

- `slice_hints(config, tp_sizes)`: for the publisher, each checkpoint tensor's walk order
  and the walk positions where sampler ranks' slices begin or end, for every TP size the
  samplers run (format v2: a record's `order` and the chunk `cuts` placed there). A rank
  then decodes exactly the chunks inside its slice, holding only its own old values.
- `worker_slices(config, tp, rank)`: for one worker, per checkpoint tensor, the rows (walk
  `rows`) or columns (walk `cols`) it holds, the parameter they live in and where there:
  fused qkv_proj / gate_up_proj, column- and vocab-parallel rows (vLLM pads the vocabulary
  to a multiple of 64 before splitting it), row-parallel columns, replicated tensors.

The layouts are those of vLLM's dense decoder models (Llama, Qwen2, Qwen3 and their kin:
`QKVParallelLinear`, `MergedColumnParallelLinear`, `RowParallelLinear`,
`VocabParallelEmbedding`, `ParallelLMHead`). A model this module does not know raises
`UnsupportedLayoutError`; the probe in `targets.vllm` can still map it on the engine."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import prod

from weight_teleport.errors import WeightTeleportError

VOCAB_PADDING = 64
"""vLLM's DEFAULT_VOCAB_PADDING_SIZE: vocab-parallel tables are padded to a multiple of it."""

ORDERS = ("rows", "cols")
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


class UnsupportedLayoutError(WeightTeleportError, ValueError):
    """The engine keeps a checkpoint tensor in a layout that cannot be cut into one
    contiguous walk range per worker (or a model this module does not know)."""


@dataclass(frozen=True)
class Slice:
    """Worker-held part of checkpoint tensor `name` (shape `shape`): its rows [lo, hi)
    (order `rows`) or columns [lo, hi) of the 2-D view [shape[0], rest] (order `cols`),
    stored at rows (resp. columns) [dest, dest + hi - lo) of parameter `param`, whose
    full local shape is `param_shape`."""
    name: str
    shape: tuple[int, ...]
    order: str
    lo: int
    hi: int
    param: str
    dest: int
    param_shape: tuple[int, ...]

    @property
    def inner(self) -> int:
        """Walk elements per row (rows) or per column (cols)."""
        return prod(self.shape[1:]) if self.order == "rows" else self.shape[0]

    @property
    def walk(self) -> tuple[int, int]:
        """This worker's elements as the walk range [start, stop) of the whole tensor."""
        return self.lo * self.inner, self.hi * self.inner

    def local_index(self, position: int) -> int:
        """The row-major flat index in the parameter of walk position `position`."""
        start, stop = self.walk
        if not start <= position < stop:
            raise IndexError(f"walk position {position} lies outside {self.name!r}'s slice [{start}, {stop})")
        line, within = divmod(position - start, self.inner)
        if self.order == "rows":
            return (self.dest + line) * self.inner + within
        return within * self.param_shape[1] + self.dest + line


@dataclass(frozen=True)
class SliceHint:
    """How a publisher walks and cuts one checkpoint tensor for sliced receivers."""
    order: str
    bounds: tuple[int, ...]
    """Walk positions strictly inside (0, numel) where some receiver's slice begins or ends,
    ascending; each a multiple of 8 (chunks start at whole digest words)."""


@dataclass(frozen=True)
class _Dims:
    vocab: int
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    bias: bool
    qk_norm: bool


def _dims(config) -> _Dims:
    c = config if isinstance(config, Mapping) else config.to_dict()
    family = c.get("model_type")
    if family not in FAMILIES:
        raise UnsupportedLayoutError(f"no vLLM layout known for model_type {family!r}; "
                                     f"known: {', '.join(FAMILIES)}")
    heads = c["num_attention_heads"]
    return _Dims(vocab=c["vocab_size"], hidden=c["hidden_size"], inter=c["intermediate_size"],
                 layers=c["num_hidden_layers"], heads=heads,
                 kv_heads=c.get("num_key_value_heads") or heads,
                 head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                 tied=bool(c.get("tie_word_embeddings", False)),
                 bias=bool(c.get("attention_bias", family == "qwen2")),
                 qk_norm=family == "qwen3")


def _split(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise UnsupportedLayoutError(f"{what} ({total}) is not divisible by the TP size {tp}")
    return total // tp


def _vocab(d: _Dims, name: str, tp: int, rank: int) -> Slice:
    per = _split(-(-d.vocab // VOCAB_PADDING) * VOCAB_PADDING, tp, "the padded vocabulary")
    lo = min(rank * per, d.vocab)
    return Slice(name, (d.vocab, d.hidden), "rows", lo, min(lo + per, d.vocab), name, 0, (per, d.hidden))


def _attention(d: _Dims, prefix: str, tp: int, rank: int) -> list[Slice]:
    hq = _split(d.heads, tp, "num_attention_heads")
    if d.kv_heads >= tp:
        hkv, kv_head = _split(d.kv_heads, tp, "num_key_value_heads"), rank * d.kv_heads // tp
    else:  # fewer KV heads than ranks: vLLM replicates each KV head over tp / kv_heads ranks
        hkv, kv_head = 1, rank // _split(tp, d.kv_heads, "the TP size over num_key_value_heads")
    hd, qkv = d.head_dim, f"{prefix}.qkv_proj"
    rows = (hq + 2 * hkv) * hd
    parts = [("q_proj", d.heads, rank * hq, hq, 0), ("k_proj", d.kv_heads, kv_head, hkv, hq),
             ("v_proj", d.kv_heads, kv_head, hkv, hq + hkv)]
    out = []
    for part, total, first, count, dest in parts:
        for kind, shape, pshape in [("weight", (total * hd, d.hidden), (rows, d.hidden))] + \
                ([("bias", (total * hd,), (rows,))] if d.bias else []):
            out.append(Slice(f"{prefix}.{part}.{kind}", shape, "rows", first * hd, (first + count) * hd,
                             f"{qkv}.{kind}", dest * hd, pshape))
    cols = _split(d.heads * hd, tp, "the attention output width")
    out.append(Slice(f"{prefix}.o_proj.weight", (d.hidden, d.heads * hd), "cols", rank * cols,
                     (rank + 1) * cols, f"{prefix}.o_proj.weight", 0, (d.hidden, cols)))
    return out


def _mlp(d: _Dims, prefix: str, tp: int, rank: int) -> list[Slice]:
    inter = _split(d.inter, tp, "intermediate_size")
    lo, hi = rank * inter, (rank + 1) * inter
    return [Slice(f"{prefix}.gate_proj.weight", (d.inter, d.hidden), "rows", lo, hi,
                  f"{prefix}.gate_up_proj.weight", 0, (2 * inter, d.hidden)),
            Slice(f"{prefix}.up_proj.weight", (d.inter, d.hidden), "rows", lo, hi,
                  f"{prefix}.gate_up_proj.weight", inter, (2 * inter, d.hidden)),
            Slice(f"{prefix}.down_proj.weight", (d.hidden, d.inter), "cols", lo, hi,
                  f"{prefix}.down_proj.weight", 0, (d.hidden, inter))]


def _replicated(name: str, shape: tuple[int, ...]) -> Slice:
    return Slice(name, shape, "rows", 0, shape[0], name, 0, shape)


def worker_slices(config, tp: int, rank: int) -> dict[str, Slice]:
    """Every checkpoint tensor of the model (a HF config or its config.json dict) as worker
    `rank` of `tp` holds it, keyed by checkpoint name (a tied lm_head is absent: the
    checkpoint has none and the engine shares the embedding)."""
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is not in [0, {tp})")
    d = _dims(config)
    out = [_vocab(d, "model.embed_tokens.weight", tp, rank), _replicated("model.norm.weight", (d.hidden,))]
    if not d.tied:
        out.append(_vocab(d, "lm_head.weight", tp, rank))
    for i in range(d.layers):
        layer = f"model.layers.{i}"
        out += _attention(d, f"{layer}.self_attn", tp, rank) + _mlp(d, f"{layer}.mlp", tp, rank)
        out += [_replicated(f"{layer}.{n}.weight", (d.hidden,))
                for n in ("input_layernorm", "post_attention_layernorm")]
        if d.qk_norm:
            out += [_replicated(f"{layer}.self_attn.{n}.weight", (d.head_dim,)) for n in ("q_norm", "k_norm")]
    return {s.name: s for s in out}


def slice_hints(config, tp_sizes: Iterable[int]) -> dict[str, SliceHint]:
    """Walk order and slice bounds of every checkpoint tensor for samplers running at any
    of `tp_sizes` (e.g. [1, 2, 8]). Replicated tensors get no bounds: every rank decodes
    them whole. Raises `UnsupportedLayoutError` if a bound is not a multiple of 8."""
    bounds: dict[str, set[int]] = {}
    orders: dict[str, str] = {}
    for tp in sorted(set(tp_sizes)):
        for rank in range(tp):
            for name, s in worker_slices(config, tp, rank).items():
                orders[name] = s.order
                numel = prod(s.shape)
                bounds.setdefault(name, set()).update(p for p in s.walk if 0 < p < numel)
    for name, cut in bounds.items():
        if bad := sorted(p for p in cut if p % 8):
            raise UnsupportedLayoutError(f"{name!r}: a sampler slice starts at walk position {bad[0]}, "
                                         "not a multiple of 8, so no chunk can end there")
    return {n: SliceHint(orders[n], tuple(sorted(bounds[n]))) for n in orders}
