"""`s3://bucket/prefix` and other fsspec object stores, through fsspec itself.

Layout: `prefix/objects/<key>` and `prefix/manifest`, as in the file store. Every
write, the manifest's included, is a single PUT, which S3 applies atomically.
Conditional manifest writes are S3 conditional PUTs (If-Match on the S3 ETag of the
manifest that was read, If-None-Match: * for the first one), which S3 and SeaweedFS
apply atomically; other fsspec protocols compare, then write (not atomic).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import fsspec

from .base import UNCONDITIONAL, IfMatch, Store
from .config import StoreConfig
from .errors import AuthError, Conflict, ManifestChanged, MissingDependency, NotFound, StoreError, TransportError
from .keys import check_manifest_etag, describe_manifest_change, manifest_etag

log = logging.getLogger(__name__)
_S3 = ("s3", "s3a")


def _storage_options(protocol: str, config: StoreConfig) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if protocol in _S3:
        if config.endpoint_url:
            options["endpoint_url"] = config.endpoint_url
        if config.key is not None:
            options["key"] = config.key
        if config.secret is not None:
            options["secret"] = config.secret
        options["config_kwargs"] = {
            "connect_timeout": config.timeout_s,
            "read_timeout": config.timeout_s,
            "retries": {"max_attempts": 1},
        }
    return {**options, **config.storage_options}


class FsspecStore(Store):
    """A store on any fsspec filesystem; S3-compatible servers via s3fs."""

    parallel_ranges = True

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, config: StoreConfig | None = None):
        super().__init__(config)
        self.fs = fs
        self.root = root.rstrip("/")
        self._s3 = any(p in _S3 for p in ([fs.protocol] if isinstance(fs.protocol, str) else fs.protocol))
        self._written: tuple[str, str] | None = None
        """(our ETag, S3's ETag) of the manifest this store last wrote: the next
        conditional write needs no read when it expects that one."""

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None) -> "FsspecStore":
        """Open `PROTOCOL://bucket/prefix` with options from `config`."""
        config = config or StoreConfig()
        protocol, _, root = url.partition("://")
        try:
            fs_class = fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            raise MissingDependency(f"the {protocol}:// store: {exc}") from exc
        except ValueError:
            raise StoreError(
                f"unknown store URL scheme {protocol!r} in {url!r}: use "
                f"file://, memory://, http://, s3:// or another fsspec "
                f"protocol"
            ) from None
        return cls(fs_class(**_storage_options(protocol, config)), root, config)

    def _path(self, key: str) -> str:
        return f"{self.root}/objects/{key}"

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run one fsspec call, mapping its exceptions onto the store's errors."""
        try:
            return getattr(self.fs, op)(*args, **kwargs)
        except FileNotFoundError:
            raise NotFound(f"no object {args[0]!r}") from None
        except PermissionError as exc:
            raise AuthError(
                f"{op} {args[0]!r} refused: {exc}; check the credentials: "
                f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or ~/.aws) for the "
                f"command line, StoreConfig(key=..., secret=...) or "
                f"storage_options in Python"
            ) from exc
        except (OSError, TimeoutError, ConnectionError) as exc:
            if _precondition_failed(exc):
                raise ManifestChanged(f"{op} {args[0]!r}: a precondition failed") from None
            raise TransportError(f"{op} {args[0]!r} failed: {exc}") from exc

    def _put(self, key: str, data: bytes) -> None:
        data = bytes(data)
        path = self._path(key)
        try:
            existing = self._call("cat_file", path)
        except NotFound:
            self._call("pipe_file", path, data)
            return
        if existing != data:
            raise Conflict(
                f"object {key!r} already exists with different bytes; objects are immutable: write under a new key"
            )

    def _get(self, key: str) -> bytes:
        return self._call("cat_file", self._path(key))

    def _get_at_most(self, key: str, max_bytes: int) -> bytes:
        return self._get_range(key, 0, max_bytes + 1)  # the base refuses a full range

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        return self._read_range(self._path(key), start, end)

    def _read_range(self, path: str, start: int, end: int) -> bytes:
        try:
            return self._call("cat_file", path, start=start, end=end)
        except TransportError:
            if start >= self._call("size", path):  # S3 answers 416 past the end
                return b""
            raise

    def _list(self, prefix: str) -> list[str]:
        base = f"{self.root}/objects/"
        top = base + prefix.rpartition("/")[0]
        self.fs.invalidate_cache(top)
        try:
            paths = self._call("find", top)
        except NotFound:
            return []
        keys = [p[len(base) :] for p in paths if p.startswith(base)]
        return [k for k in keys if k.startswith(prefix)]

    def _delete(self, key: str) -> None:
        path = self._path(key)
        self._call("info", path)  # NotFound if absent: S3 deletes silently
        self._call("rm_file", path)

    def _put_manifest(self, data: bytes, if_match: IfMatch = UNCONDITIONAL) -> None:
        path = f"{self.root}/manifest"
        if if_match is UNCONDITIONAL:
            self._written = None
            self._call("pipe_file", path, data)
        elif not self._s3:
            check_manifest_etag(self._get_manifest(), if_match)  # not atomic: see above
            self._call("pipe_file", path, data)
        else:
            self._put_manifest_s3(path, data, if_match)

    def _put_manifest_s3(self, path: str, data: bytes, if_match: str | None) -> None:
        """A conditional PUT: If-None-Match: * when no manifest is expected, else
        If-Match on the S3 ETag of the expected manifest (read with its bytes, the
        ETag first, unless this store wrote that manifest itself)."""
        if if_match is None:
            condition = {"IfNoneMatch": "*"}
        elif self._written is not None and self._written[0] == if_match:
            condition = {"IfMatch": self._written[1]}
        else:
            condition = {"IfMatch": self._s3_etag_of(path, if_match)}
        self._written = None
        try:
            reply = self._call("pipe_file", path, data, **condition)
        except ManifestChanged:
            current = self._get_manifest()
            raise ManifestChanged(
                describe_manifest_change(if_match, None if current is None else manifest_etag(current))
            ) from None
        etag = reply.get("ETag") if isinstance(reply, dict) else None
        self._written = (manifest_etag(data), etag) if etag else None

    def _s3_etag_of(self, path: str, if_match: str) -> str:
        """S3's ETag of the manifest, once its bytes are checked to be the expected
        ones; ManifestChanged if they are not."""
        try:
            etag = self._call("info", path, refresh=True)["ETag"]
        except NotFound:
            raise ManifestChanged(describe_manifest_change(if_match, None)) from None
        check_manifest_etag(self._get_manifest(), if_match)
        return etag

    def _get_manifest(self) -> bytes | None:
        try:  # one ranged GET: the base refuses a manifest that fills the range
            return self._read_range(f"{self.root}/manifest", 0, self.config.max_manifest_bytes + 1)
        except NotFound:
            return None

    def _check_write(self) -> None:
        """Write, then delete, an empty probe object beside the manifest."""
        probe = f"{self.root}/.write-check-{uuid.uuid4().hex}"
        self._call("pipe_file", probe, b"")
        self._call("rm_file", probe)


def _precondition_failed(exc: BaseException) -> bool:
    """Whether an fsspec error is an S3 412 (or 409 for a concurrent conditional
    write): s3fs turns those into plain OSErrors, the reply is in the cause."""
    cause = exc.__cause__
    reply = getattr(cause, "response", None)
    if not isinstance(reply, dict):
        return False
    code = reply.get("Error", {}).get("Code")
    status = reply.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412
