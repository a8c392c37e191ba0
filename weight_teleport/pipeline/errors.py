"""Errors of the publish/subscribe pipeline; each says what to do about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from weight_teleport.errors import WeightTeleportError

if TYPE_CHECKING:
    from weight_teleport.pipeline.health import Health


class ConfigError(WeightTeleportError, ValueError):
    """A configuration value cannot be honoured (the message names the field)."""


class ManifestError(WeightTeleportError, ValueError):
    """The store's manifest is malformed or inconsistent (wrong types, invalid keys,
    duplicate or unordered versions, too large)."""


class ManifestSignatureError(ManifestError):
    """The manifest is unsigned, signed by an untrusted key, or its signature does not
    match its contents, and the subscriber requires signatures
    (`SubscriberConfig.trusted_keys`)."""


class ManifestRollback(ManifestError):
    """The manifest's latest version is older than one the subscriber holds or has seen:
    the store was rolled back or reset. Refused unless `SubscriberConfig.follow_resets`."""


class ObjectRejected(WeightTeleportError):
    """A fetched object is not the one the manifest describes (truncated, corrupted, or a
    pack of another version); it is never decoded, and is fetched again."""


class NoPlanError(WeightTeleportError):
    """The store holds no chain of objects that reaches the wanted version (it was never
    published, or retention removed its anchor)."""


class SubscriberFailed(WeightTeleportError):
    """The subscriber gave up: it could not make progress for
    `SubscriberConfig.give_up_after_s`. Raised by `Subscriber.wait` and `apply`; the target
    keeps the last version applied, and `health` says what went wrong."""

    def __init__(self, message: str, health: "Health"):
        super().__init__(message)
        self.health = health
        """The subscriber's health when it gave up (its `last_error` is the cause)."""


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
