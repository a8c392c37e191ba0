"""Sampler formats: which of the trainer's tensors a quantized sampler holds quantized, the
names and shapes of what it holds, and the quantization itself, run where the weights are
(the trainer's GPU: one kernel pass over them; else torch on the CPU)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from weight_teleport.errors import ConfigError
from weight_teleport.quantize import fp8
from weight_teleport.quantize.names import FORMATS, quantized_name, scale_name

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


class SamplerFormat:
    """Block-wise FP8 (`fp8-block`, `quantize.fp8`): the weights of linear layers (2-D
    floating tensors named `*_proj.weight`: attention, MLP and expert projections) become
    float8_e4m3fn with a float32 `*_proj.weight_scale_inv` beside them; embeddings, norms,
    routers and the LM head stay as the trainer holds them, as in DeepSeek-V3's and
    Qwen3-*-FP8's checkpoints. The trainer's full-precision tensors never leave it."""

    name = "fp8-block"

    def quantized(self, name: str, t: torch.Tensor) -> bool:
        """Whether the sampler holds tensor `name` quantized."""
        return quantized_name(name) and t.dim() == 2 and t.is_floating_point() and t.element_size() > 1

    scale_name = staticmethod(scale_name)

    def layout(self, state: Mapping[str, torch.Tensor]) -> Layout:
        """The sampler's tensors (name -> shape, dtype) for the trainer's `state`."""
        out: Layout = {}
        for name, t in state.items():
            if not self.quantized(name, t):
                out[name] = (tuple(t.shape), t.dtype)
                continue
            scale = self.scale_name(name)
            if scale in state:
                raise ConfigError(
                    f"PublisherConfig.sampler_format={self.name!r}: the state already holds {scale!r}, "
                    f"the scale this format adds for {name!r}; publish unquantized weights"
                )
            out[name] = (tuple(t.shape), torch.float8_e4m3fn)
            out[scale] = (fp8.scale_shape(tuple(t.shape)), torch.float32)
        return out

    def quantize(self, state: Mapping[str, torch.Tensor], out: Mapping[str, torch.Tensor]) -> None:
        """Fill `out` (tensors of `layout(state)`) from `state`; raise QuantizationError
        naming the first tensor that holds NaN or Inf. Weights on a CUDA device are quantized
        there, on its current stream, and waited for here; copies of the other tensors are
        queued as `copy_(non_blocking=True)` queues them."""
        on_device = {n: t for n, t in state.items() if self.quantized(n, t) and t.is_cuda}
        for name, t in state.items():
            if name in on_device:
                continue
            if self.quantized(name, t):
                fp8.quantize_reference(name, t.detach(), out[name], out[self.scale_name(name)])
            else:
                out[name].copy_(t.detach(), non_blocking=True)
        if on_device:
            self._quantize_on_device(on_device, out)

    def _quantize_on_device(self, state: Mapping[str, torch.Tensor], out: Mapping[str, torch.Tensor]) -> None:
        """The kernel over each weight of `state` (on CUDA devices), into device buffers of
        its own device where `out`'s tensors lie elsewhere, then copied."""
        from weight_teleport.quantize.kernels import quantize_into

        flags: dict[str, torch.Tensor] = {}
        copies = []
        for name, w in state.items():
            q, s = out[name], out[self.scale_name(name)]
            here = w.device
            qd = q if q.device == here and q.stride(-1) == 1 else torch.empty(q.shape, dtype=q.dtype, device=here)
            sd = s if s.device == here and s.is_contiguous() else torch.empty(s.shape, dtype=s.dtype, device=here)
            flags[name] = torch.zeros((), dtype=torch.int32, device=here)
            quantize_into(w.detach() if w.stride(-1) == 1 else w.detach().contiguous(), qd, sd, flags[name])
            copies += [(q, qd), (s, sd)]
        for dst, src in copies:
            if dst is not src:
                dst.copy_(src, non_blocking=True)
        refused = []
        for device in {w.device for w in state.values()}:  # one read-back of the flags per device
            names = [n for n, w in state.items() if w.device == device]
            bad = torch.stack([flags[n] for n in names]).cpu()  # waits for the device's kernels
            if device.type == "cuda":  # (Triton's interpreter runs the kernel on the CPU)
                torch.cuda.current_stream(device).synchronize()  # and its copies
            refused += [n for n, b in zip(names, bad.tolist()) if b]
        if refused:
            fp8.check_finite(refused[0], state[refused[0]].detach())  # raises, naming the block
            raise AssertionError(f"the quantizer flagged {refused[0]!r} but its blocks are finite")

    def quantize_shards(
        self, tensors: Mapping[str, torch.Tensor], boxes: Mapping[str, Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A sharded trainer rank's part of the sampler's checkpoint: its `tensors` (name ->
        local shard), each the box `boxes[name]` of its checkpoint tensor (else whole), made
        into the format's tensors and their boxes. Blocks never straddle ranks, so a shard is
        quantized as the whole tensor would be there: ConfigError, naming the tensor, for a
        shard of a quantized tensor that does not start on a block's edge and end on one
        (or at the tensor's end)."""
        device = {k: t.device for k, t in tensors.items()}
        device.update({scale_name(k): d for k, d in device.items()})
        out = {k: torch.empty(shape, dtype=dt, device=device[k]) for k, (shape, dt) in self.layout(tensors).items()}
        self.quantize(tensors, out)
        placed = {k: b for k, b in boxes.items() if k in out}
        for name, box in boxes.items():
            if scale_name(name) in out:
                placed[scale_name(name)] = _scale_box(name, box)
        return out, placed

    def hf_config(self, config: bytes) -> bytes:
        """The checkpoint's config.json with this format's `quantization_config`: what an
        engine reads to load the sampler's tensors as a pre-quantized checkpoint."""
        try:
            data = json.loads(config)
        except ValueError as exc:
            raise ConfigError(f"config.json is not JSON ({exc}): it cannot name the sampler's format") from None
        if not isinstance(data, dict):
            raise ConfigError("config.json is not a JSON object: it cannot name the sampler's format")
        data["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [fp8.BLOCK, fp8.BLOCK],
            "modules_to_not_convert": ["lm_head"],
        }
        return json.dumps(data, indent=2, sort_keys=True).encode()


def _scale_box(name: str, box: Any) -> Any:
    """The box of a weight shard's block scales (`box`: the shard's box of weight `name`)."""
    out = []
    for (offset, extent), size in zip(box.box, box.shape):
        end = offset + extent
        if offset % fp8.BLOCK or (end % fp8.BLOCK and end != size):
            raise ConfigError(
                f"PublisherConfig.sampler_format='fp8-block': this rank's shard of {name!r} covers "
                f"[{offset}, {end}) of a dimension of {size}, not whole {fp8.BLOCK}-element blocks; "
                f"shard quantized weights on multiples of {fp8.BLOCK}"
            )
        out.append((offset // fp8.BLOCK, -(-end // fp8.BLOCK) - offset // fp8.BLOCK))
    return type(box)(fp8.scale_shape(tuple(box.shape)), tuple(out))


def sampler_format(name: str | None) -> SamplerFormat | None:
    """The format named `name` (None: the sampler holds the trainer's tensors as they are)."""
    if name is None:
        return None
    if name != SamplerFormat.name:
        raise ConfigError(
            f"PublisherConfig.sampler_format={name!r}: use one of {', '.join(map(repr, FORMATS))} or None"
        )
    return SamplerFormat()
