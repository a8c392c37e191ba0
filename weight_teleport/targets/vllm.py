"""A vLLM engine as a target, through vLLM's worker extension and `collective_rpc`.

    from vllm import LLM
    from weight_teleport.targets.vllm import WORKER_EXTENSION, VllmTarget
    llm = LLM(model=path, worker_extension_cls=WORKER_EXTENSION, ...)
    target = VllmTarget(llm)      # then target.apply(staged) after each version

Patches reach the workers as `collective_rpc` arguments in a plain wire form (names, ints
and bytes, which vLLM's message encoding carries without pickle): every worker receives
the whole patch and writes only the elements of its own tensor-parallel slice.

Each worker finds where a checkpoint tensor lives by probing vLLM's own loader once per
name: it loads the element indices 1..numel as the tensor into an integer capture of the
receiving parameter (all other parameters are swapped for write-protected views, so a
loader that writes elsewhere raises instead of corrupting weights) and reads back the box
that each worker holds: rows of q/k/v or gate/up inside the fused qkv_proj / gate_up_proj,
rows of column-parallel and vocab-parallel shards, columns of row-parallel shards.

vLLM's CPU backend packs linear weights for oneDNN and drops the plain tensors, so in-place
writes would not reach its kernels. On attach, a CPU worker therefore keeps plain weights
(the backend's own fallback, `torch.nn.functional.linear`) and reloads them from the model
path; it refuses an engine whose compiled graph freezes the weights into constants
(`max_autotune` in `compilation_config.inductor_compile_config`). GPU workers compute
straight from their parameters: nothing changes there.

After every `apply` and `load`, the engine's caches derived from the old weights (the
prefix cache's KV, the encoder cache) are reset before it generates again
(`vllm_engine.reset_weight_caches`); `apply` also labels its outputs with the version."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from weight_teleport.codec import StagedParts, StagedPatch
from weight_teleport.codec.dtypes import BY_TORCH
from weight_teleport.errors import PackMismatchError, WeightTeleportError
from weight_teleport.subscribe.target import Target
from weight_teleport.targets.vllm_engine import reset_weight_caches

WORKER_EXTENSION = "weight_teleport.targets.vllm.TeleportWorkerExtension"
"""Pass as `LLM(..., worker_extension_cls=WORKER_EXTENSION)`."""


class UnsupportedLayoutError(WeightTeleportError, ValueError):
    """The engine keeps a checkpoint tensor in a layout this target cannot patch in place
    (not one rectangular block per worker); reload full weights with `load` instead."""


class VllmTarget(Target):
    """A running `vllm.LLM` started with `worker_extension_cls=WORKER_EXTENSION`."""

    def __init__(self, llm) -> None:
        self._llm = llm
        llm.collective_rpc("teleport_attach")

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Reload full checkpoint-layout weights through vLLM's own in-place reload."""
        wire = [[n, str(t.dtype).removeprefix("torch."), list(t.shape), _tensor_bytes(t)] for n, t in state.items()]
        self._llm.collective_rpc("teleport_load", args=(wire,))
        reset_weight_caches(self._llm)

    def apply(self, staged: StagedPatch | StagedParts) -> None:
        wire = [
            [
                t.name,
                t.info.name,
                list(t.shape),
                [
                    [
                        c.start,
                        None if c.positions is None else c.positions.dtype.str,
                        None if c.positions is None else c.positions.tobytes(),
                        c.values.dtype.str,
                        c.values.tobytes(),
                    ]
                    for c in t.chunks
                ],
            ]
            for t in staged.tensors
            if t.chunks
        ]
        self._llm.collective_rpc("teleport_apply", args=(wire,))
        reset_weight_caches(self._llm)
        self._llm.update_weight_version(str(staged.version))

    def local_weights(self) -> list[dict[str, torch.Tensor]]:
        """Each worker's parameters as CPU copies, in vLLM's layout (for checks)."""
        replies = self._llm.collective_rpc("teleport_local_weights")
        return [{n: _tensor_from(d, s, b) for n, (d, s, b) in r.items()} for r in replies]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _tensor_from(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape)


@dataclass(frozen=True)
class _Box:
    """Checkpoint elements [lo, hi) (per dimension) live at `dest` in parameter `param`."""

    param: str
    shape: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    dest: tuple[int, ...]
    local_shape: tuple[int, ...]

    @property
    def identity(self) -> bool:
        return (
            self.shape == self.local_shape and self.lo == self.dest == (0,) * len(self.shape) and self.hi == self.shape
        )

    def locate(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask of checkpoint flat indices `idx` inside the box, and their local flat indices."""
        if self.identity:
            return torch.ones_like(idx, dtype=torch.bool), idx
        inside = torch.ones_like(idx, dtype=torch.bool)
        local = torch.zeros_like(idx)
        rest, stride = idx, 1
        for d in reversed(range(len(self.shape))):
            coord = rest % self.shape[d]
            rest = rest // self.shape[d]
            inside &= (coord >= self.lo[d]) & (coord < self.hi[d])
            local += (coord - self.lo[d] + self.dest[d]) * stride
            stride *= self.local_shape[d]
        return inside, local[inside]


def _box_from_capture(name: str, param: str, shape: tuple[int, ...], cap: torch.Tensor) -> _Box:
    """The box a probe wrote (`cap` holds checkpoint flat index + 1, or <= 0 where untouched)."""
    written = (cap > 0).nonzero()
    if cap.dim() != len(shape) or written.numel() == 0:
        raise UnsupportedLayoutError(
            f"vLLM loads checkpoint tensor {name!r} {shape} into "
            f"{param!r} {tuple(cap.shape)} in a layout with no block map"
        )
    dest = written.min(0).values
    extent = written.max(0).values + 1 - dest
    first = int(cap[tuple(dest.tolist())]) - 1
    lo = np.unravel_index(first, shape)
    hi = tuple(int(a + e) for a, e in zip(lo, extent.tolist()))
    expected = torch.zeros((), dtype=torch.int64)
    strides = torch.ones(len(shape), dtype=torch.int64)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    for d in range(len(shape)):
        axis = (torch.arange(int(extent[d])) + int(lo[d])) * strides[d]
        expected = expected.unsqueeze(-1) + axis
    block = cap[tuple(slice(int(a), int(a + e)) for a, e in zip(dest, extent))]
    if (
        len(written) != expected.numel()
        or not torch.equal(block.to(torch.int64) - 1, expected)
        or any(h > s for h, s in zip(hi, shape))
    ):
        raise UnsupportedLayoutError(
            f"vLLM scatters checkpoint tensor {name!r} into {param!r} in a layout that is not one block per worker"
        )
    return _Box(param, tuple(shape), tuple(int(v) for v in lo), hi, tuple(dest.tolist()), tuple(cap.shape))


def _param_name(model, name: str, params: Mapping) -> str | None:
    """The parameter the engine loads checkpoint tensor `name` into (fused names included):
    vLLM models name their fused projections in `packed_modules_mapping`, SGLang models in
    `bitsandbytes_stacked_params_mapping`."""
    fused = {part: f for f, parts in getattr(model, "packed_modules_mapping", {}).items() for part in parts}
    fused.update({part: f for part, (f, _) in getattr(model, "bitsandbytes_stacked_params_mapping", {}).items()})
    for candidate in [name] + [name.replace(f".{part}.", f".{f}.") for part, f in fused.items()]:
        if candidate in params:
            return candidate
    return None


def _probe_one(model, name: str, shape: tuple[int, ...], params: Mapping, saved: Mapping):
    """Load indices 1..numel as `name` into a capture of its parameter; the block it fills
    (None when the engine does not use the tensor, e.g. a tied lm_head)."""
    pname = _param_name(model, name, params)
    if pname is None and ".experts." in name:  # stacked fused-MoE parameters: no block per checkpoint tensor
        raise UnsupportedLayoutError(
            f"{name!r} lives in a stacked fused-MoE parameter, which this target "
            "does not map; use the weight-transfer backend (targets.vllm_backend)"
        )
    numel = int(np.prod(shape))
    kind = torch.int32 if numel < 2**31 - 1 else torch.int64
    cap = None if pname is None else torch.full(saved[pname].shape, -1, dtype=kind)
    if cap is not None:
        params[pname].data = cap
    try:
        model.load_weights([(name, torch.arange(1, numel + 1, dtype=kind).view(shape))])
    except (RuntimeError, KeyError) as e:
        raise UnsupportedLayoutError(
            f"the engine loads {name!r} into a parameter this target cannot name, or in a way it cannot follow: {e!r}"
        ) from e
    finally:
        if cap is not None:
            params[pname].data = _guard(saved[pname])
    if cap is None or not bool((cap > 0).any()):
        return None
    assert pname is not None  # a capture is made for a named parameter only
    return _box_from_capture(name, pname, tuple(shape), cap)


def _guard(p: torch.Tensor) -> torch.Tensor:
    """A stand-in of `p`'s shape that raises on any write (all elements share memory)."""
    return torch.empty((), dtype=p.dtype, device=p.device).expand(p.shape)


@torch.no_grad()
def probe(model, tensors: Mapping[str, tuple[int, ...]]) -> dict[str, _Box | None]:
    """Where each checkpoint tensor lives in this worker (None: the engine does not use it)."""
    params = dict(model.named_parameters())
    saved = {n: (p.data, p.requires_grad) for n, p in params.items()}
    boxes: dict[str, _Box | None] = {}
    try:
        for p in params.values():
            p.requires_grad_(False)  # integer captures cannot require gradients
            p.data = _guard(p)
        data = {n: d for n, (d, _) in saved.items()}
        for name, shape in tensors.items():
            boxes[name] = _probe_one(model, name, shape, params, data)
    finally:
        for n, p in params.items():
            p.data = saved[n][0]
            p.requires_grad_(saved[n][1])
    return boxes


def _keep_plain_cpu_weights(worker) -> None:
    """On vLLM's CPU backend, make linear layers compute from plain, patchable weights."""
    check_weights_not_frozen(worker.vllm_config)
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    layers = [m for m in worker.model_runner.get_model().modules() if hasattr(m, "cpu_linear")]
    if not layers:
        return
    for layer in layers:
        layer._cpu_skip_gemm_dispatch = True
        if layer.weight.numel() == 0:  # dropped after packing: bring the plain tensor back
            meta = get_layerwise_info(layer).restore_metadata[0]["weight"]
            layer.weight = restore_layer_refs(materialize_meta_tensor(meta), layer)
    worker.reload_weights(is_checkpoint_format=True)
    _use_plain_linear(worker)


def check_weights_not_frozen(vllm_config) -> None:
    """vLLM's CPU backend compiles with Inductor's `freezing` under `max_autotune`, which
    folds the weights into the compiled graph as constants: writes to the parameters would
    never reach it."""
    if (
        vllm_config.device_config.device_type == "cpu"
        and not vllm_config.model_config.enforce_eager
        and vllm_config.compilation_config.inductor_compile_config.get("max_autotune", False)
    ):
        raise UnsupportedLayoutError(
            "vLLM's CPU backend freezes the weights into its compiled graph under "
            "max_autotune, where in-place updates cannot reach them; start the engine "
            "without max_autotune in compilation_config.inductor_compile_config"
        )


def _use_plain_linear(worker) -> None:
    for layer in worker.model_runner.get_model().modules():
        if hasattr(layer, "cpu_linear"):
            layer.cpu_linear = torch.nn.functional.linear


class TeleportWorkerExtension:
    """Mixed into each vLLM worker; its methods run there through `collective_rpc`."""

    # the vLLM worker's, which this class is mixed into (annotations only)
    model_runner: Any
    reload_weights: Callable[..., None]

    def teleport_attach(self) -> None:
        if hasattr(self, "_teleport_boxes"):
            return
        if any(
            type(getattr(m, "quant_method", None)).__name__ == "Fp8LinearMethod"
            for m in self.model_runner.get_model().modules()
        ):
            raise UnsupportedLayoutError(
                "VllmTarget does not patch FP8 engines (its probe of the loader is unchecked there): "
                "follow the store with the weight-transfer backend (targets.vllm_backend)"
            )
        self._teleport_boxes: dict[str, _Box | None] = {}
        _keep_plain_cpu_weights(self)

    def teleport_load(self, wire: list) -> None:
        state = ((n, _tensor_from(d, s, b)) for n, d, s, b in wire)
        self.reload_weights(weights_iterator=state, is_checkpoint_format=True)
        _use_plain_linear(self)

    def teleport_apply(self, wire: list) -> None:
        model = self.model_runner.get_model()
        new = {name: tuple(shape) for name, _, shape, _ in wire if name not in self._teleport_boxes}
        if new:
            self._teleport_boxes.update(probe(model, new))
        params = dict(model.named_parameters())
        writes = [
            (params[box.param], box, chunks)
            for name, dtype, _, chunks in wire
            if (box := _checked(self._teleport_boxes[name], params, dtype)) is not None
        ]
        for param, box, chunks in writes:  # every tensor checked before the first write
            _scatter(param, box, chunks)

    def teleport_local_weights(self) -> dict[str, list]:
        return {
            n: [str(p.dtype).removeprefix("torch."), list(p.shape), _tensor_bytes(p)]
            for n, p in self.model_runner.get_model().named_parameters()
        }


def _checked(box: _Box | None, params: Mapping, dtype: str) -> _Box | None:
    if box is not None and BY_TORCH[params[box.param].dtype].name != dtype:
        raise PackMismatchError(
            f"the pack holds {box.param!r} as {dtype}, the engine runs it in "
            f"{params[box.param].dtype}; start the engine in the checkpoint's dtype"
        )
    return box


def _scatter(param: torch.nn.Parameter, box: _Box, chunks: list) -> None:
    """Write one tensor's changed elements (wire chunks) that fall in this worker's box."""
    idx, vals = [], []
    for start, pos_dtype, pos, val_dtype, val in chunks:
        v = np.frombuffer(val, dtype=val_dtype)
        idx.append(
            np.arange(start, start + v.size, dtype=np.int64)
            if pos is None
            else np.frombuffer(pos, dtype=pos_dtype).astype(np.int64) + start
        )
        vals.append(v)
    nbytes = BY_TORCH[param.dtype].nbytes
    signed = np.dtype(f"<i{nbytes}") if nbytes > 1 else np.dtype(np.uint8)
    write_box(param, box, torch.from_numpy(np.concatenate(idx)), torch.from_numpy(np.concatenate(vals).view(signed)))


def write_box(param: torch.nn.Parameter, box: _Box, idx: torch.Tensor, bits: torch.Tensor) -> None:
    """Write bit patterns `bits` at checkpoint flat indices `idx` (int64) into `param`, in
    place, keeping only the indices inside this worker's box."""
    flat = param.data.view(-1).view(BY_TORCH[param.dtype].int_torch)
    if bits.dtype != flat.dtype:
        raise PackMismatchError(
            f"the pack holds {box.param!r} as {bits.dtype} bit patterns, the "
            f"engine runs it in {param.dtype}; start it in the checkpoint's dtype"
        )
    inside, local = box.locate(idx)
    flat[local.to(flat.device)] = bits[inside].to(flat.device)
