"""What publishing and subscribing share: their configurations, errors and results, the plan
of which objects bring a sampler to a version, and fetching them from a store.

The publishing side lives in `weight_teleport.publish`, the subscribing side in
`weight_teleport.subscribe`; both import from here, never the other way.

The names are imported on first use, so that `weight_teleport.pipeline.config` and the
other plain-Python modules load without torch (the CLI's `--help` reads their defaults)."""

from weight_teleport.lazy import lazy_exports

_HOMES = {
    "Health": ".health",
    "PublishResult": ".metrics",
    "PublisherConfig": ".config",
    "RetentionConfig": ".config",
    "SubscriberConfig": ".config",
    "SubscriberFailed": ".health",
    "SubscriberStats": ".metrics",
    "UpdateReport": ".metrics",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
