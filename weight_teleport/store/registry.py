"""Open a store from its URL: a registry by scheme, each store imported on first use."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .base import Store
from .config import StoreConfig
from .errors import MissingDependency, StoreError


@dataclass(frozen=True)
class _Entry:
    target: str
    """"module:Class" of the store, relative to this package."""
    extra: str | None
    """The pip extra that installs what it needs, for the error message."""


_REGISTRY: dict[str, _Entry] = {
    "file": _Entry(".file:FileStore", None),
    "memory": _Entry(".memory:MemoryStore", None),
    "http": _Entry(".http:HttpStore", None),
    "https": _Entry(".http:HttpStore", None),
    "s3": _Entry(".fsspec_store:FsspecStore", "s3"),
    "dist": _Entry(".dist:DistStore", None),
}
# Other fsspec object stores work once their fsspec package is installed.
_FSSPEC_FALLBACK = _Entry(".fsspec_store:FsspecStore", "s3")


def register_store(scheme: str, target: str, extra: str | None = None) -> None:
    """Register a Store class ("package.module:Class") for URLs `scheme://...`."""
    _REGISTRY[scheme] = _Entry(target, extra)


def open_store(url: str, config: StoreConfig | None = None) -> Store:
    """Open the store at `url`: file:///dir, memory://name, http(s)://host:port/prefix,
    s3://bucket/prefix (or another fsspec protocol), dist://?src=0. A URL without a
    scheme is refused (a mistyped origin must not become a local directory)."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise StoreError(
            f"store URL {url!r} has no scheme: write file:///absolute/path for a directory, "
            f"http://host:port (or https://) for an origin, s3://bucket/prefix, "
            f"memory://name, or dist://?src=RANK"
        )
    entry = _REGISTRY.get(scheme, _FSSPEC_FALLBACK)
    module_name, _, class_name = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name, __package__)
    except ImportError as exc:
        hint = (
            f'pip install "weight-teleport[{entry.extra}]"'
            if entry.extra
            else f"install the package that provides {exc.name!r}"
        )
        raise MissingDependency(f"the {scheme}:// store needs {exc.name!r}, which is not installed: {hint}") from exc
    return getattr(module, class_name).from_url(url, config)
