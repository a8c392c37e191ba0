"""Copies of the weights: the publisher's baseline and its queued snapshots.

Buffers live on the CPU (pinned when CUDA is present, so copies from the GPU are DMA
transfers) or on the GPU (`baseline_device="cuda"`: device-to-device copies on a side
stream, and the CUDA codec backend encodes them there). They are allocated once per set
and recycled, so memory stays at a fixed number of copies."""

from __future__ import annotations

from collections.abc import Mapping

import math
import threading

import torch

from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.pipeline.errors import ConfigError
from weight_teleport.format.signing import ManifestSigner, signer
from weight_teleport.quantize import SamplerFormat

State = dict[str, torch.Tensor]


def state_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the tensors of `state`."""
    return sum(t.numel() * t.element_size() for t in state.values())


def check_config(config: PublisherConfig) -> ManifestSigner | None:
    """Raise ConfigError for a publisher setting that is invalid (`validate`) or that this
    machine cannot honour; the signer of its key (None: unsigned), parsed here once."""
    config.validate()
    if config.baseline_device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("PublisherConfig.baseline_device='cuda' needs a CUDA device; none is visible (use 'cpu')")
    return signer(config.signing_key)  # ConfigError now for a key that cannot sign, not after an encode


class SnapshotPool:
    """Recycled buffer sets shaped like the published state: the tensors `take` is given,
    or the sampler format `fmt` made of them."""

    def __init__(self, budget_bytes: int | None, max_sets: int, device: str = "cpu", fmt: SamplerFormat | None = None):
        self._free: list[State] = []
        self._layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
        self._budget, self._max_sets = budget_bytes, max_sets
        self._device = torch.device(device)
        self._pin = device == "cpu" and torch.cuda.is_available()
        self._stream = torch.cuda.Stream() if self._device.type == "cuda" else None
        self._lock = threading.Lock()
        self._format = fmt

    def take(self, state: Mapping[str, torch.Tensor]) -> State:
        """A copy of `state`, or the sampler format made of it (in a recycled buffer set
        when the layout is unchanged). Raises the format's QuantizationError, keeping
        nothing, for tensors it cannot quantize."""
        fmt = self._format
        layout = fmt.layout(state) if fmt else {k: (tuple(t.shape), t.dtype) for k, t in state.items()}
        with self._lock:
            if layout != self._layout:
                self._check_budget(layout)
                self._free.clear()
                self._layout = layout
            buffers = self._free.pop() if self._free else None
        if buffers is None:
            buffers = {
                k: torch.empty(shape, dtype=dtype, device=self._device, pin_memory=self._pin)
                for k, (shape, dtype) in layout.items()
            }
        try:
            if self._stream is not None:
                self._copy_on_side_stream(state, buffers)
            else:
                self._copy(state, buffers)
                if self._pin:
                    torch.cuda.synchronize()
        except BaseException:
            self.give(buffers)
            raise
        return buffers

    def _copy(self, state: Mapping[str, torch.Tensor], buffers: State) -> None:
        if self._format is not None:
            self._format.quantize(state, buffers)
            return
        for k, t in state.items():
            buffers[k].copy_(t.detach(), non_blocking=self._pin)

    def _copy_on_side_stream(self, state: Mapping[str, torch.Tensor], buffers: State) -> None:
        """Device copies that wait for the work producing `state`, off the training stream."""
        stream = self._stream
        assert stream is not None  # called only where there is a side stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._copy(state, buffers)
        stream.synchronize()

    def give(self, buffers: State | None) -> None:
        """Return a buffer set for reuse (ignored if the layout changed since)."""
        if buffers is None:
            return
        layout = {k: (tuple(t.shape), t.dtype) for k, t in buffers.items()}
        with self._lock:
            if layout == self._layout:
                self._free.append(buffers)

    def _check_budget(self, layout: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        need = sum(math.prod(shape) * dtype.itemsize for shape, dtype in layout.values()) * self._max_sets
        if self._budget is not None and need > self._budget:
            where = "GPU" if self._stream is not None else "host"
            raise ConfigError(
                f"the baseline and queued snapshots need {need / 1e9:.2f} GB of {where} memory "
                f"({self._max_sets} copies), over PublisherConfig.memory_budget_bytes="
                f"{self._budget / 1e9:.2f} GB: raise the budget or lower max_pending"
            )
