"""Host copies of the weights: the publisher's baseline and its queued snapshots.

Buffers are allocated once per set (pinned when CUDA is present, so copies from the GPU
are DMA transfers) and recycled, so memory stays at a fixed number of copies."""

from __future__ import annotations

from collections.abc import Mapping

import threading

import torch

from weight_teleport.pipeline.config import PublisherConfig
from weight_teleport.pipeline.errors import ConfigError

State = dict[str, torch.Tensor]


def state_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the tensors of `state`."""
    return sum(t.numel() * t.element_size() for t in state.values())


def check_config(config: PublisherConfig) -> None:
    """Raise ConfigError for a publisher setting this build cannot honour."""
    if config.baseline_device != "cpu":
        raise ConfigError(f"PublisherConfig.baseline_device={config.baseline_device!r}: only "
                          "'cpu' is available (the CUDA codec backend is not part of this build)")
    if config.backpressure not in ("block", "skip"):
        raise ConfigError(f"PublisherConfig.backpressure={config.backpressure!r}: use 'block' "
                          "or 'skip'")
    if config.max_pending < 1 or config.anchor_every < 1:
        raise ConfigError("PublisherConfig.max_pending and anchor_every must be >= 1")


class SnapshotPool:
    """Recycled host buffer sets shaped like the published state."""

    def __init__(self, budget_bytes: int | None, max_sets: int):
        self._free: list[State] = []
        self._layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
        self._budget, self._max_sets = budget_bytes, max_sets
        self._pin = torch.cuda.is_available()
        self._lock = threading.Lock()

    def take(self, state: Mapping[str, torch.Tensor]) -> State:
        """A host copy of `state` (in a recycled buffer set when the layout is unchanged)."""
        layout = {k: (tuple(t.shape), t.dtype) for k, t in state.items()}
        with self._lock:
            if layout != self._layout:
                self._check_budget(state)
                self._free.clear()
                self._layout = layout
            buffers = self._free.pop() if self._free else None
        if buffers is None:
            buffers = {k: torch.empty(shape, dtype=dtype, pin_memory=self._pin)
                       for k, (shape, dtype) in layout.items()}
        for k, t in state.items():
            buffers[k].copy_(t.detach(), non_blocking=self._pin)
        if self._pin:
            torch.cuda.synchronize()
        return buffers

    def give(self, buffers: State | None) -> None:
        """Return a buffer set for reuse (ignored if the layout changed since)."""
        if buffers is None:
            return
        layout = {k: (tuple(t.shape), t.dtype) for k, t in buffers.items()}
        with self._lock:
            if layout == self._layout:
                self._free.append(buffers)

    def _check_budget(self, state: Mapping[str, torch.Tensor]) -> None:
        need = state_nbytes(state) * self._max_sets
        if self._budget is not None and need > self._budget:
            raise ConfigError(
                f"the baseline and queued snapshots need {need / 1e9:.2f} GB of host memory "
                f"({self._max_sets} copies), over PublisherConfig.memory_budget_bytes="
                f"{self._budget / 1e9:.2f} GB: raise the budget or lower max_pending")
