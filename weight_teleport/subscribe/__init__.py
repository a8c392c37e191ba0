"""The sampler's side: follow a store's versions, fetch and stage each while the engine
serves, and patch the live weights of a `Target` in one short pause (`Subscriber`).

The names are imported on first use (the codec's kernels load with the first subscriber)."""

from weight_teleport.lazy import lazy_exports

_HOMES = {
    "Subscriber": ".subscriber",
    "Target": ".target",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
