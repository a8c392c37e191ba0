"""Publish weight versions from a trainer; follow them on samplers, anywhere.

The names are imported on first use, so that `weight_teleport.pipeline.config` and the
other plain-Python modules load without torch (the CLI's `--help` reads their defaults)."""

from weight_teleport.lazy import lazy_exports

_HOMES = {
    "Health": ".health",
    "PartResult": ".group",
    "PublishHandle": ".publisher",
    "PublishResult": ".metrics",
    "Publisher": ".publisher",
    "PublisherConfig": ".config",
    "PublisherGroup": ".group",
    "RetentionConfig": ".config",
    "Subscriber": ".subscriber",
    "SubscriberConfig": ".config",
    "SubscriberFailed": ".health",
    "SubscriberStats": ".metrics",
    "UpdateReport": ".metrics",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
