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
  to a multiple of 64 before splitting it), row-parallel columns, replicated tensors, and
  one expert's matrix inside a stacked fused-MoE parameter.

The layouts are those of vLLM's dense decoder models (Llama, Qwen2, Qwen3 and their kin:
`QKVParallelLinear`, `MergedColumnParallelLinear`, `RowParallelLinear`,
`VocabParallelEmbedding`, `ParallelLMHead`) and of its `FusedMoE` models (Qwen3-MoE,
Qwen2-MoE with its shared expert, Mixtral), as vLLM 0.32's loaders fill them (read in
`fused_moe/routed_experts.py`, `unquantized_fused_moe_method.py`, `expert_map_manager.py`):

- per layer, two stacked parameters `{block}.experts.routed_experts.w13_weight`
  [E_local, 2 * I_shard, H] (per expert: its gate rows, then its up rows) and `...w2_weight`
  [E_local, H, I_shard] (its down_proj columns); the router `{block}.gate.weight` [E, H] is
  replicated;
- tensor parallelism alone: every rank holds all E experts, each cut as a gate_up_proj /
  down_proj is (rows [r * I_shard, (r + 1) * I_shard) of gate and up, those columns of down);
- expert parallelism (`enable_expert_parallel`, DP = 1): EP size = TP size, the MoE layers
  are not tensor-parallel, and rank r holds experts [r * (E // tp) + min(r, E % tp), ...)
  whole, E // tp of them plus one for the first E % tp ranks (vLLM's "linear" placement;
  its "round_robin" applies to grouped-routing models only, none of these); the other
  ranks' experts are `WorkerSlices.absent` on it. Attention, dense MLPs and a shared expert
  stay tensor-parallel.

A block-FP8 checkpoint (`quantization_config` with `quant_method: fp8` and
`weight_block_size: [128, 128]`, as `PublisherConfig(sampler_format="fp8-block")` publishes)
keeps every linear weight as float8 in the same slices, and each weight's scales
`X_proj.weight_scale_inv` [ceil(N/128), ceil(K/128)] in the parameter `{param}_scale_inv`,
cut in block units: vLLM's `BlockQuantScaleParameter` of a fused layer stacks its shards'
scale rows (a shard at row offset o starts at scale row o / 128, `adjust_block_scale_shard`),
and a row-parallel layer's scales are cut by columns as its weight is. A shard that does not
start on a block (and end on one, or at the tensor's end) cannot be loaded by vLLM and is
refused here, naming it. Fused-MoE layers of a block-FP8 model are not mapped yet.

The stacked parameters hold this layout as loaded; a backend that repacks them after
loading (vLLM's CPU kernels) keeps plain copies in it (`targets.vllm_moe_cpu`). A model this
module does not know raises `UnsupportedLayoutError`; the probe in `targets.vllm` can still
map a dense one on the engine."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import prod

from weight_teleport.errors import WeightTeleportError
from weight_teleport.quantize.names import BLOCK, quantized_name, scale_name

VOCAB_PADDING = 64
"""vLLM's DEFAULT_VOCAB_PADDING_SIZE: vocab-parallel tables are padded to a multiple of it."""

ORDERS = ("rows", "cols")
DENSE = ("llama", "qwen2", "qwen3", "mistral")
MOE = ("qwen3_moe", "qwen2_moe", "mixtral")
FAMILIES = DENSE + MOE


class UnsupportedLayoutError(WeightTeleportError, ValueError):
    """The engine keeps a checkpoint tensor in a layout that cannot be cut into one
    contiguous walk range per worker (or a model this module does not know)."""


@dataclass(frozen=True)
class Slice:
    """Worker-held part of checkpoint tensor `name` (shape `shape`): its rows [lo, hi)
    (order `rows`) or columns [lo, hi) of the 2-D view [shape[0], rest] (order `cols`),
    stored at rows (resp. columns) [dest, dest + hi - lo) of parameter `param`, whose
    full local shape is `param_shape`; with `expert`, of the matrix `param[expert]` of a
    stacked parameter [E_local, ...] instead (one expert of a fused-MoE layer)."""

    name: str
    shape: tuple[int, ...]
    order: str
    lo: int
    hi: int
    param: str
    dest: int
    param_shape: tuple[int, ...]
    expert: int | None = None

    @property
    def matrix_shape(self) -> tuple[int, ...]:
        """The shape of what the slice lies in: the parameter, or its matrix `expert`."""
        return self.param_shape if self.expert is None else self.param_shape[1:]

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
        base = 0 if self.expert is None else self.expert * prod(self.matrix_shape)
        if self.order == "rows":
            return base + (self.dest + line) * self.inner + within
        return base + within * self.matrix_shape[1] + self.dest + line


class WorkerSlices(dict):
    """One worker's slices by checkpoint name (`worker_slices`), and `absent`: the shapes,
    by checkpoint name, of the model's tensors it holds no element of (other ranks' experts
    under expert parallelism), which it skips rather than refuses."""

    def __init__(self, slices: Mapping[str, Slice], absent: Mapping[str, tuple[int, ...]] | None = None):
        super().__init__(slices)
        self.absent = dict(absent or {})


def absent_of(slices: Mapping[str, Slice]) -> dict[str, tuple[int, ...]]:
    """`slices.absent` where it is a `WorkerSlices`, else none."""
    return getattr(slices, "absent", {})


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
    experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    moe_inter: int = 0
    sparse: frozenset = frozenset()
    """Indices of the layers whose MLP is a fused-MoE block."""
    block: str = "mlp"
    """The MoE block's module name in a layer (`mlp`, Mixtral's `block_sparse_moe`)."""
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """Checkpoint names of an expert's gate, up and down projections."""
    shared_inter: int = 0
    """A shared expert's intermediate size (0: none)."""
    shared_gate: bool = False
    fp8_block: bool = False
    """A block-FP8 checkpoint: linear weights in float8 with 128 x 128 block scales."""
    not_converted: tuple[str, ...] = ()
    """Modules a block-FP8 checkpoint keeps unquantized (`modules_to_not_convert`)."""


def _quantization(c: Mapping) -> dict:
    """The `_Dims` fields of the checkpoint's `quantization_config` (none: unquantized)."""
    q = c.get("quantization_config")
    if not q:
        return {}
    method, block = q.get("quant_method"), q.get("weight_block_size")
    if method != "fp8" or list(block or ()) != [BLOCK, BLOCK]:
        raise UnsupportedLayoutError(
            f"no vLLM layout known for quantization {method!r} with weight_block_size {block!r}; "
            f"known: fp8 with [{BLOCK}, {BLOCK}] blocks (block-FP8)"
        )
    return dict(fp8_block=True, not_converted=tuple(q.get("modules_to_not_convert") or ()))


def _experts(c: Mapping) -> int:
    """Routed experts per layer: `num_experts` (Qwen's configs) or `num_local_experts`
    (Mixtral's, and transformers 5's Qwen3-MoE config, which aliases one to the other)."""
    return c["num_experts"] if "num_experts" in c else c["num_local_experts"]


def _dims(config) -> _Dims:
    c = config if isinstance(config, Mapping) else config.to_dict()
    family = c.get("model_type")
    if family not in FAMILIES:
        raise UnsupportedLayoutError(f"no vLLM layout known for model_type {family!r}; known: {', '.join(FAMILIES)}")
    heads = c["num_attention_heads"]
    layers = c["num_hidden_layers"]
    moe = {}
    if family == "mixtral":
        moe = dict(
            experts=_experts(c),
            moe_inter=c["intermediate_size"],
            sparse=frozenset(range(layers)),
            block="block_sparse_moe",
            names=("w1", "w3", "w2"),
        )
    elif family in MOE:  # Qwen's sparse layers, as vLLM's Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer pick them
        experts, step = _experts(c), c.get("decoder_sparse_step") or 1
        dense = set(c.get("mlp_only_layers") or ())
        shared = c.get("shared_expert_intermediate_size") or 0
        moe = dict(
            experts=experts,
            moe_inter=c["moe_intermediate_size"],
            shared_inter=shared,
            sparse=frozenset(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0),
            shared_gate=family == "qwen2_moe" or shared > 0,
        )
    quantization = _quantization(c)
    if quantization and moe.get("sparse"):
        raise UnsupportedLayoutError(
            f"{family}: the fused-MoE layers of a block-FP8 model are not mapped (their scales' layout "
            "depends on vLLM's MoE backend); serve it unquantized"
        )
    return _Dims(
        vocab=c["vocab_size"],
        hidden=c["hidden_size"],
        inter=c.get("intermediate_size") or 0,
        layers=layers,
        heads=heads,
        kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        tied=bool(c.get("tie_word_embeddings", False)),
        bias=family == "qwen2_moe" or bool(c.get("attention_bias", family == "qwen2")),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        **moe,
        **quantization,
    )


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
    parts = [
        ("q_proj", d.heads, rank * hq, hq, 0),
        ("k_proj", d.kv_heads, kv_head, hkv, hq),
        ("v_proj", d.kv_heads, kv_head, hkv, hq + hkv),
    ]
    out = []
    for part, total, first, count, dest in parts:
        for kind, shape, pshape in [("weight", (total * hd, d.hidden), (rows, d.hidden))] + (
            [("bias", (total * hd,), (rows,))] if d.bias else []
        ):
            out.append(
                Slice(
                    f"{prefix}.{part}.{kind}",
                    shape,
                    "rows",
                    first * hd,
                    (first + count) * hd,
                    f"{qkv}.{kind}",
                    dest * hd,
                    pshape,
                )
            )
    cols = _split(d.heads * hd, tp, "the attention output width")
    out.append(
        Slice(
            f"{prefix}.o_proj.weight",
            (d.hidden, d.heads * hd),
            "cols",
            rank * cols,
            (rank + 1) * cols,
            f"{prefix}.o_proj.weight",
            0,
            (d.hidden, cols),
        )
    )
    return out


def _mlp(d: _Dims, prefix: str, tp: int, rank: int, total: int | None = None) -> list[Slice]:
    total = d.inter if total is None else total
    inter = _split(total, tp, "intermediate_size")
    lo, hi = rank * inter, (rank + 1) * inter
    return [
        Slice(
            f"{prefix}.gate_proj.weight",
            (total, d.hidden),
            "rows",
            lo,
            hi,
            f"{prefix}.gate_up_proj.weight",
            0,
            (2 * inter, d.hidden),
        ),
        Slice(
            f"{prefix}.up_proj.weight",
            (total, d.hidden),
            "rows",
            lo,
            hi,
            f"{prefix}.gate_up_proj.weight",
            inter,
            (2 * inter, d.hidden),
        ),
        Slice(
            f"{prefix}.down_proj.weight",
            (d.hidden, total),
            "cols",
            lo,
            hi,
            f"{prefix}.down_proj.weight",
            0,
            (d.hidden, inter),
        ),
    ]


def expert_range(experts: int, tp: int, rank: int, expert_parallel: bool) -> range:
    """The global experts worker `rank` of `tp` holds: all of them under tensor parallelism,
    vLLM's linear placement under expert parallelism (`determine_expert_map`: E // tp each,
    one more for each of the first E % tp ranks)."""
    if not expert_parallel or tp == 1:
        return range(experts)
    base, extra = divmod(experts, tp)
    first = rank * base + min(rank, extra)
    return range(first, first + base + (rank < extra))


def _moe(d: _Dims, prefix: str, tp: int, rank: int, ep: bool) -> tuple[list[Slice], dict[str, tuple[int, ...]]]:
    """A fused-MoE block's slices, and the shapes of the experts this worker does not hold."""
    if tp > d.experts:
        raise UnsupportedLayoutError(f"the TP size {tp} exceeds the {d.experts} experts (vLLM refuses it)")
    h, total = d.hidden, d.moe_inter
    mine = expert_range(d.experts, tp, rank, ep)
    inter = total if ep else _split(total, tp, "moe_intermediate_size")
    lo, hi = (0, total) if ep else (rank * inter, (rank + 1) * inter)
    stacked = f"{prefix}.experts.routed_experts"
    w13, w2 = (len(mine), 2 * inter, h), (len(mine), h, inter)
    gate, up, down = d.names
    out: list[Slice] = []
    absent: dict[str, tuple[int, ...]] = {}
    for e in range(d.experts):
        names = [f"{prefix}.experts.{e}.{n}.weight" for n in (gate, up, down)]
        if e not in mine:
            absent.update({names[0]: (total, h), names[1]: (total, h), names[2]: (h, total)})
            continue
        local = e - mine.start
        out += [
            Slice(names[0], (total, h), "rows", lo, hi, f"{stacked}.w13_weight", 0, w13, local),
            Slice(names[1], (total, h), "rows", lo, hi, f"{stacked}.w13_weight", inter, w13, local),
            Slice(names[2], (h, total), "cols", lo, hi, f"{stacked}.w2_weight", 0, w2, local),
        ]
    out.append(_replicated(f"{prefix}.gate.weight", (d.experts, h)))
    if d.shared_inter:
        out += _mlp(d, f"{prefix}.shared_expert", tp, rank, d.shared_inter)
    if d.shared_gate:
        out.append(_replicated(f"{prefix}.shared_expert_gate.weight", (1, h)))
    return out, absent


def _replicated(name: str, shape: tuple[int, ...]) -> Slice:
    return Slice(name, shape, "rows", 0, shape[0], name, 0, shape)


def _blocks(s: Slice, value: int, what: str, end: int | None = None) -> int:
    """`value` (a row or column of `s`) in scale blocks; UnsupportedLayoutError unless it
    lies on a block's edge (or is `end`, where a last, ragged block ends)."""
    if value % BLOCK and value != end:
        raise UnsupportedLayoutError(
            f"{s.name!r}: this worker's {what} {value} is not a multiple of the FP8 block ({BLOCK}); "
            f"vLLM cannot load its block scales ({s.param!r})"
        )
    return -(-value // BLOCK)


def _scales(s: Slice) -> Slice:
    """The slice of `s`'s block scales, for a block-FP8 weight slice `s`."""
    full = s.shape[0] if s.order == "rows" else s.shape[1]
    lo, hi = _blocks(s, s.lo, "first " + s.order[:-1]), _blocks(s, s.hi, "end", full)
    dest = _blocks(s, s.dest, "place in the fused parameter")
    matrix = tuple(-(-n // BLOCK) for n in s.matrix_shape)
    shape = tuple(-(-n // BLOCK) for n in s.shape)
    param_shape = matrix if s.expert is None else (s.param_shape[0], *matrix)
    return Slice(scale_name(s.name), shape, s.order, lo, hi, scale_name(s.param), dest, param_shape, s.expert)


def _converted(d: _Dims, s: Slice) -> bool:
    return (
        d.fp8_block
        and quantized_name(s.name)
        and len(s.shape) == 2
        and not any(s.name == m or s.name.startswith(m + ".") for m in d.not_converted)
    )


def worker_slices(config, tp: int, rank: int, expert_parallel: bool = False) -> WorkerSlices:
    """Every checkpoint tensor of the model (a HF config or its config.json dict) as worker
    `rank` of `tp` holds it, keyed by checkpoint name (a tied lm_head is absent: the
    checkpoint has none and the engine shares the embedding). `expert_parallel`: the engine
    runs with `enable_expert_parallel` (and one data-parallel rank): the MoE layers' experts
    are spread whole over the `tp` ranks, the ones this worker lacks listed in `absent`."""
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is not in [0, {tp})")
    d = _dims(config)
    out = [_vocab(d, "model.embed_tokens.weight", tp, rank), _replicated("model.norm.weight", (d.hidden,))]
    absent: dict[str, tuple[int, ...]] = {}
    if not d.tied:
        out.append(_vocab(d, "lm_head.weight", tp, rank))
    for i in range(d.layers):
        layer = f"model.layers.{i}"
        out += _attention(d, f"{layer}.self_attn", tp, rank)
        if i in d.sparse:
            moe, lacks = _moe(d, f"{layer}.{d.block}", tp, rank, expert_parallel)
            out += moe
            absent.update(lacks)
        else:
            out += _mlp(d, f"{layer}.mlp", tp, rank)
        out += [
            _replicated(f"{layer}.{n}.weight", (d.hidden,)) for n in ("input_layernorm", "post_attention_layernorm")
        ]
        if d.qk_norm:
            out += [_replicated(f"{layer}.self_attn.{n}.weight", (d.head_dim,)) for n in ("q_norm", "k_norm")]
    out += [_scales(s) for s in out if _converted(d, s)]
    return WorkerSlices({s.name: s for s in out}, absent)


def slice_hints(
    config, tp_sizes: Iterable[int], expert_parallel: bool | Iterable[bool] = False
) -> dict[str, SliceHint]:
    """Walk order and slice bounds of every checkpoint tensor for samplers running at any
    of `tp_sizes` (e.g. [1, 2, 8]), with expert parallelism off, on, or either
    (`expert_parallel`: a bool or several: (False, True)). Replicated tensors and experts
    held whole get no bounds: a rank decodes them whole or skips them. Raises
    `UnsupportedLayoutError` if a bound is not a multiple of 8."""
    bounds: dict[str, set[int]] = {}
    orders: dict[str, str] = {}
    modes = {expert_parallel} if isinstance(expert_parallel, bool) else set(expert_parallel)
    for tp in sorted(set(tp_sizes)):
        for ep in sorted(modes):
            for rank in range(tp):
                for name, s in worker_slices(config, tp, rank, ep).items():
                    orders[name] = s.order
                    numel = prod(s.shape)
                    bounds.setdefault(name, set()).update(p for p in s.walk if 0 < p < numel)
    for name, cut in bounds.items():
        if bad := sorted(p for p in cut if p % 8):
            raise UnsupportedLayoutError(
                f"{name!r}: a sampler slice starts at walk position {bad[0]}, "
                "not a multiple of 8, so no chunk can end there"
            )
    return {n: SliceHint(orders[n], tuple(sorted(bounds[n]))) for n in orders}
