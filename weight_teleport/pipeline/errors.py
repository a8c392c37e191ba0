"""Errors of the publish/subscribe pipeline; each says what to do about it."""

from weight_teleport.errors import WeightTeleportError


class ConfigError(WeightTeleportError, ValueError):
    """A configuration value cannot be honoured (the message names the field)."""


class ManifestError(WeightTeleportError, ValueError):
    """The store's manifest is malformed or inconsistent (duplicate or unordered versions)."""


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


class PublishFailed(WeightTeleportError):
    """Versions failed to publish (`Publisher.flush` / `close`): `versions` lists them,
    the message says why, the first failure is the cause."""

    def __init__(self, failures: list[tuple[int, BaseException]]):
        self.versions = [v for v, _ in failures]
        reasons = "; ".join(f"version {v}: {exc}" for v, exc in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} version(s) failed to publish: {reasons}{more}")
