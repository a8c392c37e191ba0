"""The trainer's side: publish weight versions to a store, from one process (`Publisher`)
or from every rank of a sharded trainer as parts of one version (`PublisherGroup`).

The names are imported on first use (the codec's kernels load with the first publisher)."""

from weight_teleport.lazy import lazy_exports

_HOMES = {
    "PartResult": ".group",
    "PublishHandle": ".publisher",
    "Publisher": ".publisher",
    "PublisherGroup": ".group",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
