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
    """Bearer token that uploads (PUT, DELETE) must present; None refuses all uploads.
    It reads too."""
    read_token: str | None = None
    """Bearer token that every read (GET, but /healthz) must present, the upload token
    being accepted too; None lets anyone who reaches the server read. A cache in front
    of the origin serves its copies without asking: see docs/ARCHITECTURE.md."""
    tls_cert_file: Path | None = None
    """PEM certificate chain to serve HTTPS with (with `tls_key_file`); None: plain HTTP
    (or TLS terminated by a proxy in front)."""
    tls_key_file: Path | None = None
    """PEM private key of `tls_cert_file`."""
    max_object_bytes: int = 64 << 30
    """Largest object accepted; larger uploads get 413."""
    max_manifest_bytes: int = 16 << 20
    """Largest manifest accepted; larger uploads get 413."""
    max_watch_s: float = 60.0
    """Longest a `/watch` long-poll is held open; longer requested timeouts are cut."""
    max_connections: int = 1000
    """Open client connections at most. At the limit a new connection closes the one
    idle the longest (between requests, or still sending its request line and headers),
    else ends the oldest long-poll early; if neither exists, it gets 503. The server
    raises its open-file limit to fit two files per connection where the hard limit
    allows, else serves fewer (it says so)."""
    reserved_connections: int | None = None
    """Connection slots that reads cannot hold: requests without the upload token (every
    read, long-poll and heartbeat; /healthz excepted) hold at most `max_connections -
    reserved_connections` at once, so that writes and health probes always find room. A
    read beyond that ends the oldest long-poll early, else gets 503; a long-poll beyond
    it is answered at once. None: a tenth of `max_connections` (at most
    `max_connections - 1` in any case)."""
    header_timeout_s: float = 15.0
    """Longest a client may take, from the first byte of a request, to send its request
    line and headers (and a TLS handshake); slower connections are closed."""
    body_timeout_s: float = 30.0
    """Longest an upload's body may stall (no byte received; 408), or a response's client
    pause its reading (less than 1 MiB read in this time: the connection is closed, and
    the cut logged in one line). It bounds a stall, never a whole transfer."""
    keepalive_timeout_s: float = 30.0
    """Longest an idle connection (no request yet, or between requests) is kept open."""
    disk_check_s: float = 1.0
    """How often a long-poll re-reads the manifest file, to notice writers that bypass
    the server (a publisher writing the same directory through `file://`)."""
    chunk_bytes: int = 1 << 20
    """Size of the reads that stream objects from disk where `sendfile` cannot (TLS)."""
    sampler_stale_s: float = 30.0
    """A sampler whose last heartbeat is older than this shows as "stale" on the status
    page (a few of its heartbeats were missed: stopped, or cut off)."""
    sampler_expiry_s: float = 3600.0
    """A sampler unheard for this long is forgotten."""
    max_samplers: int = 10_000
    """Samplers kept in memory at most; a heartbeat from a new one beyond gets 503."""

    def __post_init__(self) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("ServerConfig: tls_cert_file and tls_key_file go together (--tls-cert and --tls-key)")
        for name in ("token", "read_token"):
            value = getattr(self, name)
            if value is not None and not (value.isascii() and value.isprintable() and " " not in value and value):
                raise ValueError(f"ServerConfig.{name}: a bearer token is printable ASCII without spaces (RFC 6750)")
        if self.max_connections < 1:
            raise ValueError(f"ServerConfig.max_connections must be >= 1, not {self.max_connections}")
        if self.reserved_connections is not None and not 0 <= self.reserved_connections < self.max_connections:
            raise ValueError(
                f"ServerConfig.reserved_connections must be in [0, max_connections), not {self.reserved_connections}"
            )

    @property
    def reserve(self) -> int:
        """The slots reads cannot hold: `reserved_connections` or its default."""
        wanted = self.max_connections // 10 if self.reserved_connections is None else self.reserved_connections
        return min(wanted, self.max_connections - 1)  # max_connections may have been lowered

    @property
    def scheme(self) -> str:
        """ "https" when the server terminates TLS itself, else "http"."""
        return "http" if self.tls_cert_file is None else "https"
