"""HF-style safetensors checkpoints on disk: what `publish` reads and `pull` writes."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from weight_teleport.pipeline.errors import ConfigError
from weight_teleport.format.manifest import MAX_SIDE_FILES

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "model.safetensors"
MAX_SIDE_FILE_BYTES = 64 << 20
"""Largest side file carried with the anchors (a tokenizer.json is a few MB)."""
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".h5",
    ".msgpack",
    ".onnx",
)
"""Files that hold weights, or index them: never side files (`pull` writes one
model.safetensors, which a shard index would contradict)."""
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,254}\Z")


def load_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the `*.safetensors` files of `directory` (single or sharded)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"{directory} holds no *.safetensors file: give the directory of an "
            "HF-style checkpoint (model.safetensors or model-0000X-of-0000N.safetensors)"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(f)
        except SafetensorError as exc:
            raise ConfigError(
                f"{f} is not a readable safetensors file ({exc}): truncated, still being written, or not a checkpoint"
            ) from None
        clash = set(part) & set(state)
        if clash:
            raise ConfigError(f"tensor {sorted(clash)[0]!r} appears in two files of {directory}")
        state.update(part)
    return state


VERSION_KEY = "weight_teleport_version"
"""The metadata key of model.safetensors that `pull` writes: the store version it holds."""


def checkpoint_version(directory: Path) -> int | None:
    """The store version `pull` wrote into `directory`'s model.safetensors (None: not one
    `pull` wrote, or not a version number)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(Path(directory) / CHECKPOINT_FILE), "pt") as f:
            value = (f.metadata() or {}).get(VERSION_KEY)
    except (OSError, SafetensorError):
        return None
    return int(value) if value is not None and value.isdigit() else None


def save_checkpoint(state: Mapping[str, torch.Tensor], directory: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write `state` as `directory/model.safetensors` (a standard checkpoint)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    tmp = directory / f".{CHECKPOINT_FILE}.tmp"
    save_file({k: t.contiguous() for k, t in state.items()}, str(tmp), metadata=metadata)
    tmp.replace(path)
    return path


def load_side_files(directory: Path) -> dict[str, bytes]:
    """The checkpoint's small side files (config.json, generation_config.json, tokenizer
    files...): every plain file of `directory` that holds no weights, up to
    MAX_SIDE_FILE_BYTES each (larger ones are skipped, with a warning)."""
    files: dict[str, bytes] = {}
    for path in sorted(Path(directory).iterdir()):
        name = path.name
        if not path.is_file() or name.endswith(WEIGHT_SUFFIXES) or not _NAME.match(name):
            continue
        size = path.stat().st_size
        if size > MAX_SIDE_FILE_BYTES:
            log.warning("side file %s skipped: %d bytes, more than %d", path, size, MAX_SIDE_FILE_BYTES)
            continue
        files[name] = path.read_bytes()
    if len(files) > MAX_SIDE_FILES:
        raise ConfigError(
            f"{directory} holds {len(files)} side files; at most {MAX_SIDE_FILES} "
            "go with an anchor: move the others out of the checkpoint directory"
        )
    return files


def save_side_files(files: Mapping[str, bytes], directory: Path) -> list[Path]:
    """Write each side file beside the weights (atomically, each)."""
    written = []
    for name, data in files.items():
        path, tmp = Path(directory) / name, Path(directory) / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(path)
        written.append(path)
    return written
