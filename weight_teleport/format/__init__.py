"""The pack container and the store's manifest: pure bytes in, bytes out (no files, no devices).
Spec: docs/FORMAT.md.

The names are imported on first use, so that `weight_teleport.format.codecs` (the codec
registry, plain Python) loads without numpy: the CLI's `--help` reads its choices."""

from weight_teleport.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["FORMAT_VERSION", "ChunkRef", "PackHeader", "TensorRecord"], ".header"),
    **dict.fromkeys(
        ["MAGIC", "chunk_payload", "prefix_bound", "read_header", "write_pack", "write_pack_into"], ".container"
    ),
    **dict.fromkeys(["Group", "Stream", "read_groups", "write_groups"], ".groups"),
    "PackLimits": ".limits",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
