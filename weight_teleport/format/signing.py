"""Ed25519 signatures of manifests (optional: `pip install 'weight-teleport[sign]'`).

A publisher with `PublisherConfig.signing_key` adds a "signature" member to every
manifest it writes; a subscriber with `SubscriberConfig.trusted_keys` refuses manifests
without a valid signature by one of those keys. Every manifest entry names its pack's
size and SHA-256, and the subscriber checks both before decoding, so the signature covers
the packs too (docs/FORMAT.md, Manifest; docs/SECURITY.md)."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from collections.abc import Sequence

from weight_teleport.errors import ConfigError, ManifestSignatureError

ALGORITHM = "ed25519"
_INSTALL = "pip install 'weight-teleport[sign]' (the `cryptography` package)"
_SUBSCRIBE_HINT = "SubscriberConfig.trusted_keys; the publisher signs with PublisherConfig.signing_key"
_RESUME_HINT = (
    "a publisher with PublisherConfig.signing_key resumes only from manifests its "
    "key signed; to start signing an unsigned store, use resume=False and publish "
    "at a version after the store's latest"
)


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ConfigError(f"manifest signatures need the `cryptography` package: {_INSTALL}") from None
    return ed25519


def _raw_public(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: bytes) -> str:
    """A short name of a raw public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def generate_keypair() -> tuple[bytes, bytes]:
    """A new (private, public) Ed25519 key pair, 32 raw bytes each: the private key for
    `PublisherConfig.signing_key`, the public one for `SubscriberConfig.trusted_keys`."""
    from cryptography.hazmat.primitives import serialization

    private = _ed25519().Ed25519PrivateKey.generate()
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return raw, _raw_public(private.public_key())


def public_key(private_key: bytes) -> bytes:
    """The raw public key of a private key (32 raw bytes or PEM)."""
    return _raw_public(_load_private(private_key).public_key())


def _load_private(key: bytes):
    ed25519 = _ed25519()
    if not isinstance(key, bytes):
        raise ConfigError(
            f"PublisherConfig.signing_key is a {type(key).__name__}: give the "
            "Ed25519 private key's 32 raw bytes or its PEM bytes"
        )
    if len(key) == 32:
        return ed25519.Ed25519PrivateKey.from_private_bytes(key)
    from cryptography.hazmat.primitives import serialization

    try:
        loaded = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"PublisherConfig.signing_key is neither 32 raw bytes nor an unencrypted PEM private key ({exc})"
        ) from None
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"PublisherConfig.signing_key is a {type(loaded).__name__}, not Ed25519")
    return loaded


def _load_public(key: bytes):
    ed25519 = _ed25519()
    if not isinstance(key, bytes):
        raise ConfigError(
            f"SubscriberConfig.trusted_keys holds a {type(key).__name__}: give "
            "each Ed25519 public key as 32 raw bytes or PEM bytes"
        )
    if len(key) == 32:
        return ed25519.Ed25519PublicKey.from_public_bytes(key)
    from cryptography.hazmat.primitives import serialization

    try:
        loaded = serialization.load_pem_public_key(key)
    except ValueError as exc:
        raise ConfigError(
            f"a key of SubscriberConfig.trusted_keys is neither 32 raw bytes nor a PEM public key ({exc})"
        ) from None
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise ConfigError(f"a key of SubscriberConfig.trusted_keys is a {type(loaded).__name__}, not Ed25519")
    return loaded


class ManifestSigner:
    """Signs a manifest's canonical bytes (the `sign` of `Manifest.to_json`)."""

    def __init__(self, private_key: bytes):
        self._key = _load_private(private_key)
        self.key_id = key_id(_raw_public(self._key.public_key()))

    def __call__(self, canonical: bytes) -> dict:
        signature = base64.b64encode(self._key.sign(canonical)).decode("ascii")
        return {"alg": ALGORITHM, "key_id": self.key_id, "sig": signature}

    def verifier(self) -> "ManifestVerifier":
        """A verifier of this key's own signatures: what a resumed publisher checks the
        store's manifest with before building on it."""
        return ManifestVerifier([_raw_public(self._key.public_key())], hint=_RESUME_HINT)


@functools.lru_cache(maxsize=4)
def signer(private_key: bytes | None) -> ManifestSigner | None:
    """The signer of a configured key (parsed once), or None for no key."""
    return None if private_key is None else ManifestSigner(private_key)


class ManifestVerifier:
    """Checks a manifest's signature against trusted public keys (the `verify` of
    `manifest.from_json`); raises ManifestSignatureError."""

    def __init__(self, trusted_keys: Sequence[bytes], hint: str = _SUBSCRIBE_HINT):
        keys = [_load_public(k) for k in trusted_keys]
        self._keys = {key_id(_raw_public(k)): k for k in keys}
        self._hint = hint

    def __call__(self, canonical: bytes, signature: object) -> None:
        key, sig = self._parse(signature)
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(sig, canonical)
        except InvalidSignature:
            raise ManifestSignatureError(
                "the manifest's signature does not match its contents: it was modified after it was signed (refused)"
            ) from None

    def _parse(self, signature: object):
        """(the trusted key named, the raw signature) of a "signature" member."""
        trusted = sorted(self._keys)
        if signature is None:
            raise ManifestSignatureError(
                f"the manifest is unsigned; only manifests signed by key(s) {trusted} are accepted ({self._hint})"
            )
        if not isinstance(signature, dict) or signature.get("alg") != ALGORITHM:
            raise ManifestSignatureError(f"the manifest's signature is not an {ALGORITHM} signature object")
        key_id = signature.get("key_id")
        key = self._keys.get(key_id) if isinstance(key_id, str) else None  # JSON: may be a list
        if key is None:
            raise ManifestSignatureError(
                f"the manifest is signed by key {str(signature.get('key_id'))[:40]!r}, not by a "
                f"trusted key {trusted} ({self._hint})"
            )
        try:
            sig = base64.b64decode(str(signature.get("sig")), validate=True)
        except (binascii.Error, ValueError):
            sig = b""
        if len(sig) != 64:
            raise ManifestSignatureError("the manifest's signature is not 64 bytes of base64")
        return key, sig
