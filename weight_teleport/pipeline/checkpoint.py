"""HF-style safetensors checkpoints on disk: what `publish` reads and `pull` writes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from weight_teleport.pipeline.errors import ConfigError

CHECKPOINT_FILE = "model.safetensors"


def load_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the `*.safetensors` files of `directory` (single or sharded)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{directory} holds no *.safetensors file: give the directory of an "
                          "HF-style checkpoint (model.safetensors or model-0000X-of-0000N.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(f)
        clash = set(part) & set(state)
        if clash:
            raise ConfigError(f"tensor {sorted(clash)[0]!r} appears in two files of {directory}")
        state.update(part)
    return state


def save_checkpoint(state: Mapping[str, torch.Tensor], directory: Path,
                    metadata: dict[str, str] | None = None) -> Path:
    """Write `state` as `directory/model.safetensors` (a standard checkpoint)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    tmp = directory / f".{CHECKPOINT_FILE}.tmp"
    save_file({k: t.contiguous() for k, t in state.items()}, str(tmp), metadata=metadata)
    tmp.replace(path)
    return path
