"""Publish weight versions from a trainer; follow them on samplers, anywhere.

The names are imported on first use, so that `weight_teleport.pipeline.config` and the
other plain-Python modules load without torch (the CLI's `--help` reads their defaults)."""

import importlib

_WHERE = {
    "Health": "health",
    "PublishHandle": "publisher",
    "PublishResult": "metrics",
    "Publisher": "publisher",
    "PublisherConfig": "config",
    "RetentionConfig": "config",
    "Subscriber": "subscriber",
    "SubscriberConfig": "config",
    "SubscriberFailed": "errors",
    "SubscriberStats": "metrics",
    "UpdateReport": "metrics",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"weight_teleport.pipeline.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'weight_teleport.pipeline' has no attribute {name!r}")
