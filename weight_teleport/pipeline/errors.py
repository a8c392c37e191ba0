"""Errors of the publish/subscribe pipeline; each says what to do about it (a subscriber that
gives up raises `health.SubscriberFailed`, which carries its health)."""

from __future__ import annotations

from weight_teleport.errors import ConfigError, ManifestError, ManifestSignatureError, WeightTeleportError

# ConfigError and the manifest's errors live with the library's other typed errors (the
# manifest's format, format/manifest.py, raises them); the pipeline names them from here too
__all__ = [
    "ConfigError",
    "GroupFailed",
    "ManifestError",
    "ManifestRollback",
    "ManifestSignatureError",
    "NoPlanError",
    "ObjectRejected",
    "PublishCancelled",
    "PublishConflict",
    "PublishFailed",
]


class ManifestRollback(ManifestError):
    """The manifest's latest version is older than one the subscriber holds or has seen:
    the store was rolled back or reset. Refused unless `SubscriberConfig.follow_resets`."""


class ObjectRejected(WeightTeleportError):
    """A fetched object is not the one the manifest describes (truncated, corrupted, or a
    pack of another version); it is never decoded, and is fetched again."""


class NoPlanError(WeightTeleportError):
    """The store holds no chain of objects that reaches the wanted version (it was never
    published, or retention removed its anchor)."""


class PublishConflict(WeightTeleportError):
    """Another publisher updated the store's manifest since this one read it: the version
    was not announced, and this publisher publishes nothing more (one publisher per store)."""


class PublishCancelled(WeightTeleportError):
    """The version was not published: the publisher was cancelled (`Publisher.cancel`,
    Ctrl-C) before it was announced."""


class GroupFailed(WeightTeleportError):
    """A collective of a `PublisherGroup`'s ranks failed: a rank died, left or timed out
    (the message says which error). No version in hand is published; close the group on
    every surviving rank and start the ranks again (a new group goes on from the store's
    latest version)."""


class PublishFailed(WeightTeleportError):
    """Versions failed to publish (`Publisher.flush` / `close`): `versions` lists them,
    the message says why, the first failure is the cause."""

    def __init__(self, failures: list[tuple[int, BaseException]]):
        self.versions = [v for v, _ in failures]
        reasons = "; ".join(f"version {v}: {exc}" for v, exc in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} version(s) failed to publish: {reasons}{more}")
