"""The pack container: pure bytes in, bytes out (no files, no devices). Spec: docs/FORMAT.md."""

from weight_teleport.format.container import (
    FORMAT_VERSION,
    MAGIC,
    ChunkRef,
    PackHeader,
    TensorRecord,
    chunk_payload,
    prefix_bound,
    read_header,
    write_pack,
    write_pack_into,
)
from weight_teleport.format.groups import Group, Stream, read_groups, write_groups
from weight_teleport.format.limits import PackLimits

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "ChunkRef",
    "Group",
    "PackHeader",
    "PackLimits",
    "Stream",
    "TensorRecord",
    "chunk_payload",
    "prefix_bound",
    "read_groups",
    "read_header",
    "write_groups",
    "write_pack",
    "write_pack_into",
]
