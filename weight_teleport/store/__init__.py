"""Transports: object stores of immutable blobs plus one small mutable manifest."""

from .base import UNCONDITIONAL, Store
from .config import RetryConfig, StoreConfig
from .errors import (
    AuthError,
    Conflict,
    InvalidKey,
    ManifestChanged,
    MissingDependency,
    NotFound,
    RangeIgnored,
    StoreError,
    StoreFull,
    TooLarge,
    TransportError,
)
from .keys import manifest_etag
from .registry import open_store, register_store

__all__ = [
    "Store",
    "StoreConfig",
    "RetryConfig",
    "open_store",
    "register_store",
    "manifest_etag",
    "UNCONDITIONAL",
    "StoreError",
    "NotFound",
    "InvalidKey",
    "AuthError",
    "TooLarge",
    "Conflict",
    "ManifestChanged",
    "StoreFull",
    "TransportError",
    "RangeIgnored",
    "MissingDependency",
]
