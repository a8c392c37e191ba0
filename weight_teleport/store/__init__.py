"""Transports: object stores of immutable blobs plus one small mutable manifest."""

from .base import Store
from .config import RetryConfig, StoreConfig
from .errors import (AuthError, Conflict, InvalidKey, MissingDependency, NotFound,
                     StoreError, TooLarge, TransportError)
from .keys import manifest_etag
from .registry import open_store, register_store

__all__ = [
    "Store", "StoreConfig", "RetryConfig", "open_store", "register_store",
    "manifest_etag", "StoreError", "NotFound", "InvalidKey", "AuthError", "TooLarge",
    "Conflict", "TransportError", "MissingDependency",
]
