"""Origin server configuration: a dataclass, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServerConfig:
    """Options of the HTTP origin (`weight-teleport serve`)."""

    root: Path
    """Directory that holds the objects and the manifest (the `file://` store layout)."""
    host: str = "127.0.0.1"
    """Address to listen on; "0.0.0.0" to serve other machines."""
    port: int = 8000
    """TCP port to listen on; 0 picks a free one."""
    token: str | None = None
    """Bearer token that uploads (PUT, DELETE) must present; None refuses all uploads."""
    max_object_bytes: int = 64 << 30
    """Largest object accepted; larger uploads get 413."""
    max_manifest_bytes: int = 16 << 20
    """Largest manifest accepted; larger uploads get 413."""
    max_watch_s: float = 60.0
    """Longest a `/watch` long-poll is held open; longer requested timeouts are cut."""
    disk_check_s: float = 1.0
    """How often a long-poll re-reads the manifest file, to notice writers that bypass
    the server (a publisher writing the same directory through `file://`)."""
    chunk_bytes: int = 1 << 20
    """Size of the reads and writes that stream objects to and from disk."""
