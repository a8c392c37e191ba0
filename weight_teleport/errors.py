"""Typed errors. Every error a user can act on says what to do about it."""


class WeightTeleportError(Exception):
    """Base class of every error this library raises on purpose."""


class PackFormatError(WeightTeleportError, ValueError):
    """The bytes are not a well-formed pack: bad magic, truncated, corrupted (failed checksum)."""


class PackLimitError(PackFormatError):
    """The pack may be well formed but needs more than a limit the reader set allows
    (`weight_teleport.format.PackLimits`): a larger header, tensor or state."""


class UnsupportedFormatError(PackFormatError):
    """The pack uses a format version or a stream codec this build cannot read."""


class PackMismatchError(WeightTeleportError, ValueError):
    """The pack is well formed but does not fit the state it is applied to
    (other tensor names, shapes or dtypes, another base version, or other base weights)."""


class DigestMismatchError(WeightTeleportError):
    """The weights a pack would produce do not have the digest the pack promises."""


class ConfigError(WeightTeleportError, ValueError):
    """A configuration value cannot be honoured (the message names the field)."""


class ManifestError(WeightTeleportError, ValueError):
    """The store's manifest is malformed or inconsistent (wrong types, invalid keys,
    duplicate or unordered versions, too large)."""


class ManifestSignatureError(ManifestError):
    """The manifest is unsigned, signed by an untrusted key, or its signature does not
    match its contents, and the subscriber requires signatures
    (`SubscriberConfig.trusted_keys`)."""


class QuantizationError(WeightTeleportError, ValueError):
    """A weight cannot be quantized to the sampler's format (it holds NaN or Inf): the
    message names the tensor and the block; nothing was published."""
