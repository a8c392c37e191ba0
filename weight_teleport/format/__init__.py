"""The pack container: pure bytes in, bytes out (no files, no devices). Spec: docs/FORMAT.md.

The names are imported on first use, so that `weight_teleport.format.codecs` (the codec
registry, plain Python) loads without numpy: the CLI's `--help` reads its choices."""

import importlib

_WHERE = {
    **dict.fromkeys(["FORMAT_VERSION", "MAGIC", "ChunkRef", "PackHeader", "TensorRecord", "chunk_payload",
                     "prefix_bound", "read_header", "write_pack", "write_pack_into"], "container"),
    **dict.fromkeys(["Group", "Stream", "read_groups", "write_groups"], "groups"),
    "PackLimits": "limits",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"weight_teleport.format.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'weight_teleport.format' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
