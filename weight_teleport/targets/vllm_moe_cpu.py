"""vLLM's fused-MoE layers in a worker: which of them hold the loader's layout
(`targets.vllm_layout`) and, on vLLM's CPU backend, plain copies of those that do not.

vLLM 0.32 keeps the stacked `w13_weight` / `w2_weight` of an unquantized `FusedMoE` layer as
its loaders fill them on the Triton backends (CUDA, ROCm without padding); the other
backends rewrite them after loading (FlashInfer swaps or re-blocks them, AITER shuffles
them, XPU transposes them), and those are refused (`check_moe_layers`).

The CPU experts (`CPUUnquantizedExperts.process_weights_after_loading`,
`fused_moe/experts/cpu_moe.py`) pad each expert's intermediate size to a multiple of 32
(gate rows at [0, I), up rows at [Ip, Ip + I), zeros between) and replace both parameters
by a prepacked copy (`cpu_prepack_moe_weight`: per expert, a blocked transposition of its
matrix in the order of the kernel's ISA), which is all their kernel reads. Writes in the
loader's layout would scramble it. A CPU worker therefore stages against plain copies in
the loader's layout (`CpuPackedExperts.plain`), unpacked from the parameters by the inverse
of the packing (found by packing index patterns: the packing moves bits, per expert), and
packs them again into the parameters in place after every commit that applied a version
(`CpuPackedExperts.repack`), so the kernel never reads a stale derived tensor. The cost:
one more copy of the experts in host memory and a repack of every MoE layer in each pause.

The copies are unpacked when the worker's weight-transfer engine is made, right after
vLLM loaded (and packed) the weights, and again from a parameter the engine replaced. A
reload of full weights (`reload_weights`, `VllmTarget.load`) is not followed: vLLM 0.32's
CPU backend writes the reloaded experts into the same tensors in the loader's layout and
does not pack them again (its kernel then misreads them until the next commit packs the
copies back); start the transfer engine from an anchor after one."""

from collections.abc import Mapping
from typing import Any

import torch

from weight_teleport.targets.vllm_layout import UnsupportedLayoutError

PLAIN_BACKENDS = ("TRITON", "BATCHED_TRITON")
"""vLLM unquantized MoE backends whose kernels read the stacked parameters as loaded."""


def moe_layers(model) -> dict[str, Any]:
    """The model's fused-MoE expert modules (vLLM's `RoutedExperts`, whose attributes the
    checker does not know) by module name."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(getattr(m, "w13_weight", None), torch.Tensor) and hasattr(m, "expert_map_manager")
    }


def _cpu_packer(layer):
    """The CPU experts that prepack `layer`'s weights, or None where the weights stay plain."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    kernel = getattr(layer.quant_method, "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    if isinstance(experts, CPUUnquantizedExperts) and not experts._use_zentorch:
        return experts
    return None


def check_moe_layers(model, expected: Mapping[str, range]) -> None:
    """Refuse fused-MoE layers whose parameters are not in the layout `vllm_layout` gives:
    quantized or biased experts, a backend that rewrites them after loading, or local
    experts other than `expected` (module name -> the global experts `expert_range` gives)."""
    for name, layer in moe_layers(model).items():
        method = type(layer.quant_method).__name__
        if method != "UnquantizedFusedMoEMethod":
            raise UnsupportedLayoutError(f"{name}: experts quantized by {method}; only unquantized experts are mapped")
        if getattr(layer, "w13_bias", None) is not None:
            raise UnsupportedLayoutError(f"{name}: experts with biases are not mapped")
        backend = layer.quant_method.unquantized_backend.name
        if backend not in PLAIN_BACKENDS and backend != "CPU":
            raise UnsupportedLayoutError(
                f"{name}: vLLM's {backend} MoE backend rewrites the expert weights after "
                "loading; only the Triton and CPU backends are mapped"
            )
        mine = layer.expert_map_manager.get_local_expert_ids()
        want = expected.get(name)
        if want is not None and mine != list(want):
            raise UnsupportedLayoutError(
                f"{name}: the engine holds experts {mine}, the layout expects {list(want)} "
                "(expert placement other than vLLM's linear one, or EPLB)"
            )


class CpuPackedExperts:
    """Plain copies of the prepacked fused-MoE parameters of a vLLM CPU worker's `model`,
    by parameter name, in the loader's layout."""

    def __init__(self, model) -> None:
        self.layers = {
            name: (layer, packer)
            for name, layer in moe_layers(model).items()
            if (packer := _cpu_packer(layer)) is not None
        }
        self._plain: dict[str, torch.Tensor] = {}
        self._seen: dict[str, int] = {}
        """Parameter name -> id of the packed parameter the plain copy was unpacked from."""
        self._perms: dict[tuple, torch.Tensor] = {}
        self.plain()  # now, while the parameters hold what vLLM's load packed

    def __bool__(self) -> bool:
        return bool(self.layers)

    def plain(self) -> dict[str, torch.Tensor]:
        """The plain copies (unpacked again where the engine replaced a parameter)."""
        for name, (layer, packer) in self.layers.items():
            for kind in ("w13_weight", "w2_weight"):
                key, param = f"{name}.{kind}", getattr(layer, kind)
                if self._seen.get(key) != id(param):
                    self._plain[key] = self._unpack(layer, packer, kind, param.data)
                    self._seen[key] = id(param)
        return dict(self._plain)

    def repack(self) -> None:
        """Pack the plain copies into the parameters, in place: what the kernel reads."""
        for name, (layer, packer) in self.layers.items():
            for kind in ("w13_weight", "w2_weight"):
                key = f"{name}.{kind}"
                param = getattr(layer, kind)
                if self._seen.get(key) != id(param):
                    raise RuntimeError(f"{key} was replaced since its plain copy was taken; stage again")
                padded = self._pad(layer, packer, kind, self._plain[key])
                torch.ops._C.prepack_moe_weight(padded, param.data, packer.isa)

    @staticmethod
    def _sizes(layer, packer) -> tuple[int, int]:
        return layer.moe_config.intermediate_size_per_partition, packer._padded_intermediate_size(layer.moe_config)

    def _pad(self, layer, packer, kind: str, plain: torch.Tensor) -> torch.Tensor:
        inter, padded = self._sizes(layer, packer)
        if padded == inter:
            return plain
        e, rows, cols = plain.shape
        if kind == "w2_weight":
            out = plain.new_zeros(e, rows, padded)
            out[:, :, :inter] = plain
            return out
        out = plain.new_zeros(e, 2 * padded, cols)
        out[:, :inter], out[:, padded : padded + inter] = plain[:, :inter], plain[:, inter:]
        return out

    def _unpack(self, layer, packer, kind: str, packed: torch.Tensor) -> torch.Tensor:
        e, rows, cols = packed.shape
        perm = self._perm(rows, cols, packed.dtype, packer.isa)
        flat = packed.reshape(e, -1)
        full = torch.empty_like(flat)
        full[:, perm] = flat  # perm[p]: the plain position of packed position p
        full = full.view(e, rows, cols)
        inter, padded = self._sizes(layer, packer)
        if padded == inter:
            return full
        if kind == "w2_weight":
            return full[:, :, :inter].contiguous()
        return torch.cat([full[:, :inter], full[:, padded : padded + inter]], dim=1)

    def _perm(self, rows: int, cols: int, dtype: torch.dtype, isa: str) -> torch.Tensor:
        """For one expert's [rows, cols] matrix: the plain flat index of each packed position."""
        key = (rows, cols, dtype, isa)
        if key not in self._perms:
            size = torch.empty((), dtype=dtype).element_size()
            ints = {2: torch.int16, 4: torch.int32}[size]
            index = torch.arange(rows * cols, dtype=torch.int64)
            perm = torch.zeros(rows * cols, dtype=torch.int64)
            for shift in (0,) if size == 4 else (0, 16):  # 16-bit elements: the index in two halves
                pattern = ((index >> shift) & ((1 << (8 * size)) - 1)).to(torch.int32)
                if size == 2:
                    pattern = torch.where(pattern >= 1 << 15, pattern - (1 << 16), pattern)
                src = pattern.to(ints).view(dtype).view(1, rows, cols).contiguous()
                out = torch.empty_like(src)
                torch.ops._C.prepack_moe_weight(src, out, isa)
                got = out.view(ints).view(-1).to(torch.int64) & ((1 << (8 * size)) - 1)
                perm |= got << shift
            if not torch.equal(perm.sort().values, index):
                raise UnsupportedLayoutError(
                    f"vLLM's CPU MoE packing ({isa}) of a {rows}x{cols} {dtype} matrix "
                    "is not a permutation of its elements"
                )
            self._perms[key] = perm
        return self._perms[key]
