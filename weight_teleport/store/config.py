"""Store configuration: plain dataclasses, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class RetryConfig:
    """How a store retries transient errors (TransportError) before giving up."""

    attempts: int = 5
    """Total tries of one operation, the first included."""
    backoff_s: float = 0.05
    """Delay before the first retry; doubled after each failure."""
    backoff_max_s: float = 2.0
    """Upper bound of the delay between two tries."""


@dataclass
class StoreConfig:
    """Options of `open_store`; each store reads the fields that concern it."""

    retry: RetryConfig = field(default_factory=RetryConfig)
    """Retries of transient errors, shared by every store."""
    watch_poll_s: float = 0.05
    """First polling interval of `watch` for stores without change notification."""
    watch_poll_max_s: float = 1.0
    """Longest polling interval of `watch` (the interval doubles up to it)."""
    timeout_s: float = 60.0
    """Network timeout of one request (http, s3), in seconds."""
    token: str | None = None
    """Bearer token for uploads to an HTTP origin (`http://`, `https://`): the origin's
    upload token. It also reads when `read_token` is None."""
    read_token: str | None = None
    """Bearer token for reads from an HTTP origin that requires one (`serve
    --read-token-file`); sent instead of `token` on every read, so a cache or CDN in
    front of the origin never sees the upload token."""
    ca_file: str | None = None
    """PEM file of the certificate authority that signed an `https://` origin's
    certificate (a self-signed one included); None trusts the system's authorities
    (and `SSL_CERT_FILE`)."""
    max_manifest_bytes: int = 64 << 20
    """Largest manifest (and key listing) read from a store; more raises TooLarge."""
    endpoint_url: str | None = None
    """Endpoint of an S3-compatible server (`s3://`), e.g. "http://127.0.0.1:8333"."""
    key: str | None = None
    """S3 access key id; None lets s3fs find credentials the usual way."""
    secret: str | None = None
    """S3 secret access key; None lets s3fs find credentials the usual way."""
    storage_options: dict[str, Any] = field(default_factory=dict)
    """Extra fsspec options for `s3://` and other fsspec stores (override the above)."""
    upload_progress: Callable[[int], None] | None = None
    """Called with the number of bytes sent as an HTTP upload streams out (a progress bar's
    `update`); None: uploads go out in one piece, silently."""
