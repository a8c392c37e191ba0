"""`s3://bucket/prefix` and other fsspec object stores, through fsspec itself.

Layout: `prefix/objects/<key>` and `prefix/manifest`, as in the file store. Every
write, the manifest's included, is a single PUT, which S3 applies atomically.
"""

from __future__ import annotations

from typing import Any

import fsspec

from .base import Store
from .config import StoreConfig
from .errors import AuthError, Conflict, MissingDependency, NotFound, StoreError, \
    TransportError


def _storage_options(protocol: str, config: StoreConfig) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if protocol in ("s3", "s3a"):
        if config.endpoint_url:
            options["endpoint_url"] = config.endpoint_url
        if config.key is not None:
            options["key"] = config.key
        if config.secret is not None:
            options["secret"] = config.secret
        options["config_kwargs"] = {"connect_timeout": config.timeout_s,
                                    "read_timeout": config.timeout_s,
                                    "retries": {"max_attempts": 1}}
    return {**options, **config.storage_options}


class FsspecStore(Store):
    """A store on any fsspec filesystem; S3-compatible servers via s3fs."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str,
                 config: StoreConfig | None = None):
        super().__init__(config)
        self.fs = fs
        self.root = root.rstrip("/")

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
            raise StoreError(f"unknown store URL scheme {protocol!r} in {url!r}: use "
                             f"file://, memory://, http://, s3:// or another fsspec "
                             f"protocol") from None
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
            raise AuthError(f"{op} {args[0]!r} refused: {exc}; check the credentials "
                            f"(StoreConfig.key/secret or storage_options)") from exc
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise TransportError(f"{op} {args[0]!r} failed: {exc}") from exc

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            existing = self._call("cat_file", path)
        except NotFound:
            self._call("pipe_file", path, data)
            return
        if existing != data:
            raise Conflict(f"object {key!r} already exists with different bytes; "
                           f"objects are immutable: write under a new key")

    def _get(self, key: str) -> bytes:
        return self._call("cat_file", self._path(key))

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
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
        keys = [p[len(base):] for p in paths if p.startswith(base)]
        return [k for k in keys if k.startswith(prefix)]

    def _delete(self, key: str) -> None:
        path = self._path(key)
        self._call("info", path)  # NotFound if absent: S3 deletes silently
        self._call("rm_file", path)

    def _put_manifest(self, data: bytes) -> None:
        self._call("pipe_file", f"{self.root}/manifest", data)

    def _get_manifest(self) -> bytes | None:
        try:
            return self._call("cat_file", f"{self.root}/manifest")
        except NotFound:
            return None
