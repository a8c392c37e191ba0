"""weight-teleport: bit-exact, tiny weight deltas from RL trainers to samplers anywhere.

The top level holds what a user of the library starts from: the publisher and subscriber,
their configurations, the torch target, the codec's functions and the errors. Everything
else lives in its package (`weight_teleport.codec`: hints, slices, `inspect`, digests;
`weight_teleport.publish`, `weight_teleport.subscribe`, `weight_teleport.targets`, ...).

The names are imported on first use, so that `import weight_teleport.<module>` stays light
(it does not load the codec's compiled kernels)."""

import importlib

__version__ = "0.1.0"

_HOMES = {
    **dict.fromkeys(
        ["apply_delta", "apply_staged", "decode_snapshot", "encode_delta", "encode_snapshot", "stage_delta"],
        "weight_teleport.codec",
    ),
    **dict.fromkeys(["Publisher", "PublisherGroup"], "weight_teleport.publish"),
    **dict.fromkeys(["PublisherConfig", "RetentionConfig", "SubscriberConfig"], "weight_teleport.pipeline"),
    "Subscriber": "weight_teleport.subscribe",
    "StoreConfig": "weight_teleport.store",
    "TorchTarget": "weight_teleport.targets.torch",
}
"""Every public name -> the module that defines it."""
__all__ = sorted(_HOMES) + ["errors"]


def __getattr__(name: str):
    if name == "errors":
        return importlib.import_module("weight_teleport.errors")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'weight_teleport' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(__all__ + ["__version__"])
