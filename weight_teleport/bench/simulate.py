"""Simulated RL weight deltas of a Qwen3-style decoder.

The benchmark needs deltas whose statistics match what an RL trainer publishes: which
bf16 elements flip, and by how many ULPs, depends on the magnitude of each weight and on
the size of each AdamW update, so both are modelled.

Weights (fp32 master copy), per tensor, HF-style names:

* Linear and embedding matrices: ``w = std * r[row] * c[col] * x``.
  ``std = 1 / sqrt(fan_in)`` for projections (0.02 for the input embedding), which puts
  a 1024-wide model near the 0.02-0.03 spread of trained checkpoints.
  ``r`` and ``c`` are log-normal per-row (sigma 0.3) and per-column (sigma 0.2) scales,
  the structured variation trained matrices show (outlier channels, hot rows).
  ``x`` is standard normal with a heavy-tailed minority: 5% of the elements are drawn
  from a Student-t with 4 degrees of freedom instead.
* RMSNorm weights (``input_layernorm``, ``post_attention_layernorm``, ``model.norm``):
  log-normal around 1.0 (sigma 0.25). The per-head ``q_norm`` / ``k_norm`` weights have
  a wider spread (sigma 0.5), as in trained Qwen3 checkpoints.

Gradients, per element and step: ``g = s[row] * (a[row] * z + e_t)``.
``z`` is a fixed per-element direction (regenerated from the seed each step, so it costs
no memory), which correlates successive gradients so the Adam moments carry signal;
``a`` is a per-row log-normal signal-to-noise amplitude (sigma 1); ``e_t`` is fresh noise
with the same heavy-tailed mixture as the weights; ``s`` is a per-row log-normal
gradient scale (sigma 1, around 1e-4). AdamW (betas 0.9/0.999, eps 1e-8, weight decay
0.01 on matrices only) first warms its moments for a few steps without moving weights,
then every step updates the fp32 master and publishes a bf16 copy
(round to nearest even, ``tensor.to(torch.bfloat16)``).

Calibration (`Calibration`; `REAL_STEPS` is the benchmark's default). `UNCALIBRATED`, the
first scales, changes several times more bf16 elements per step than real AdamW steps of a
pretrained LM at the same learning rate: real trained weights are larger than
1/sqrt(fan_in), and real minibatch gradients are noise-dominated, so Adam's normalised
update is smaller. `REAL_STEPS` scales the weights (`weight_gain`, `embed_gain`), lengthens
the warm-up to the real run's 8 steps and divides the signal-to-noise amplitude by 10, so
that the shares of changed matrix and embedding elements and of one-ULP moves follow the
real steps (`weight_teleport.bench.real`); `python bench/calibrate_sim.py` prints both side
by side, and docs/benchmarks/2026-12-04-notes.md has the fit. Not matched: real RMSNorm
weights move a little; the simulated ones (near 1.0) hardly do.

Everything is deterministic for a given seed and device (each tensor, step and stream has
its own generator, so the result does not depend on iteration order).
"""

import hashlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Calibration:
    """The scales of the simulated weights and gradients (see the module docstring)."""

    weight_gain: float = 1.0
    """Projections' standard deviation is ``weight_gain / sqrt(fan_in)``."""
    embed_gain: float = 1.0
    """The input embedding's standard deviation is ``0.02 * embed_gain``."""
    warmup: int = 3
    """Steps that warm the AdamW moments before the first published step."""
    signal: float = 1.0
    """Multiplies every row's signal-to-noise amplitude ``a`` of the gradients."""


UNCALIBRATED = Calibration()
"""The simulator as first written: weights at 1/sqrt(fan_in), signal-dominated gradients.
It stays the default of `make_state` and `delta_pairs`, so that the CUDA, end-to-end and
slow-link benchmarks keep the data their figures were measured on."""
REAL_STEPS = Calibration(weight_gain=4.8, embed_gain=3.75, warmup=8, signal=0.1)
"""Fit to real AdamW steps (`weight_teleport.bench.real`, SmolLM2-135M on real text), see
"Calibration" in the module docstring: the default of `weight-teleport bench --data sim`."""

_TAIL_FRACTION = 0.05
_GRAD_SCALE = 1e-4


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Qwen3-style decoder (untied embeddings, no biases)."""

    name: str
    hidden: int
    """Model width."""
    intermediate: int
    """MLP width."""
    layers: int
    """Number of decoder layers."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    vocab: int
    """Vocabulary size (rows of the embedding and of lm_head)."""


CONFIGS = {
    "tiny": ModelConfig("tiny", 128, 384, 2, 4, 2, 32, 8192),
    "small": ModelConfig("small", 512, 1536, 12, 8, 4, 64, 32000),
    "qwen3-0.6b": ModelConfig("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936),
    "qwen3-4b": ModelConfig("qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936),
    "qwen3-8b": ModelConfig("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936),
}


def make_config(name: str) -> ModelConfig:
    """Return the named model config: one of ``CONFIGS``."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; choose one of {sorted(CONFIGS)}")
    return CONFIGS[name]


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Return every tensor name of the model, in checkpoint order, with its shape."""
    h, q, kv = config.hidden, config.heads * config.head_dim, config.kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab, h)}
    for i in range(config.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (config.head_dim,),
            p + "self_attn.k_norm.weight": (config.head_dim,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (config.intermediate, h),
            p + "mlp.up_proj.weight": (config.intermediate, h),
            p + "mlp.down_proj.weight": (h, config.intermediate),
        }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (config.vocab, h)}
    return shapes


def _generator(device: torch.device, *keys: object) -> torch.Generator:
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return torch.Generator(device).manual_seed(int.from_bytes(digest, "little") >> 1)


def _log_normal(n: int, sigma: float, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(n, generator=gen, device=gen.device).mul_(sigma).exp_()


def _heavy_tailed(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Standard normal samples, a random ~5% of them replaced by Student-t(4) samples."""
    x = torch.randn(shape, generator=gen, device=gen.device)
    flat = x.view(-1)
    k = round(_TAIL_FRACTION * flat.numel())
    # unique: a repeated index would leave the winning write up to the scatter order
    where = torch.randint(flat.numel(), (k,), generator=gen, device=gen.device).unique()
    k = where.numel()
    u = 1.0 - torch.rand((2, k), generator=gen, device=gen.device)
    chi2_4 = u.log().sum(0).mul_(-2.0)  # chi-square with 4 dof: -2 log(U1 U2)
    flat[where] = torch.randn(k, generator=gen, device=gen.device) / (chi2_4 / 4).sqrt()
    return x


def _init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator, cal: "Calibration") -> torch.Tensor:
    if len(shape) == 1:
        sigma = 0.5 if name.endswith(("q_norm.weight", "k_norm.weight")) else 0.25
        return _log_normal(shape[0], sigma, gen)
    rows, cols = shape
    std = 0.02 * cal.embed_gain if "embed_tokens" in name else cal.weight_gain / math.sqrt(cols)
    w = _heavy_tailed(shape, gen).mul_(std)
    w.mul_(_log_normal(rows, 0.3, gen)[:, None]).mul_(_log_normal(cols, 0.2, gen)[None, :])
    return w


def make_state(
    config: ModelConfig, seed: int = 0, device: str = "cpu", calibration: "Calibration | None" = None
) -> State:
    """Return fp32 master weights with trained-like magnitudes (see the module docstring),
    scaled by `calibration` (default `UNCALIBRATED`)."""
    cal = calibration or UNCALIBRATED
    dev = torch.device(device)
    return {
        name: _init_tensor(name, shape, _generator(dev, seed, "init", name), cal)
        for name, shape in tensor_shapes(config).items()
    }


def publish(master: State) -> State:
    """Return the bf16 copy a trainer publishes (round to nearest even)."""
    return {name: w.to(torch.bfloat16) for name, w in master.items()}


class AdamWSimulator:
    """AdamW on synthetic RL gradients; each ``step(lr)`` returns the new bf16 weights.

    ``master`` (fp32) is updated in place. The moments are warmed for ``warmup`` steps
    without moving the weights, so the first published step already has a trained-like
    mix of consistent and noisy directions.
    """

    def __init__(
        self,
        master: State,
        seed: int = 0,
        warmup: int = 3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        signal: float = 1.0,
    ):
        self.master, self.seed, self.signal = master, seed, signal
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self._m = {name: torch.zeros_like(w) for name, w in master.items()}
        self._v = {name: torch.zeros_like(w) for name, w in master.items()}
        self._scales = {name: self._row_scales(name, w) for name, w in master.items()}
        self._t = 0
        for _ in range(warmup):
            self._advance(lr=None)

    def step(self, lr: float) -> State:
        """Apply one AdamW step at learning rate ``lr``; return the published bf16 state."""
        self._advance(lr)
        return publish(self.master)

    def _row_scales(self, name: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row (noise scale, signal scale), shaped to broadcast over ``w``."""
        gen = _generator(w.device, self.seed, "scales", name)
        shape = (w.shape[0],) + (1,) * (w.dim() - 1)
        noise = _log_normal(w.shape[0], 1.0, gen).mul_(_GRAD_SCALE)
        signal = noise * _log_normal(w.shape[0], 1.0, gen).mul_(self.signal)
        return noise.view(shape), signal.view(shape)

    def _gradient(self, name: str, w: torch.Tensor) -> torch.Tensor:
        noise_scale, signal_scale = self._scales[name]
        direction_gen = _generator(w.device, self.seed, "direction", name)
        direction = torch.randn(w.shape, generator=direction_gen, device=w.device)
        noise = _heavy_tailed(w.shape, _generator(w.device, self.seed, "noise", name, self._t))
        return direction.mul_(signal_scale).add_(noise.mul_(noise_scale))

    def _advance(self, lr: float | None) -> None:
        """Update the moments; also move the weights unless ``lr`` is None (warm-up)."""
        self._t += 1
        b1, b2 = self.betas
        for name, w in self.master.items():
            g = self._gradient(name, w)
            m, v = self._m[name], self._v[name]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            if lr is None:
                continue
            denom = v.sqrt().div_(math.sqrt(1 - b2**self._t)).add_(self.eps)
            if w.dim() > 1:
                w.mul_(1 - lr * self.weight_decay)
            w.addcdiv_(m, denom, value=-lr / (1 - b1**self._t))


def delta_pairs(
    master: State, lr: float, steps: int, seed: int = 0, calibration: "Calibration | None" = None
) -> Iterator[tuple[State, State]]:
    """Yield ``steps`` successive (old, new) bf16 states; ``master`` advances in place.
    ``calibration`` (default `UNCALIBRATED`) sets the warm-up and signal of the gradients;
    make ``master`` with the same one."""
    cal = calibration or UNCALIBRATED
    simulator = AdamWSimulator(master, seed, warmup=cal.warmup, signal=cal.signal)
    old = publish(master)
    for _ in range(steps):
        new = simulator.step(lr)
        yield old, new
        old = new
