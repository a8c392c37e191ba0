"""Signed manifests: a publisher signs with an Ed25519 key, subscribers given the public
key refuse unsigned, tampered, foreign-signed and replayed (older) manifests, and keep
their weights. The packs are covered through the sizes and SHA-256s the manifest lists."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from weight_versions import expected, same_bits  # noqa: E402
from weight_versions import FAST, publish  # noqa: E402
from test_subscriber_recovery import follow_checked, until, zeros  # noqa: E402
from weight_teleport.codec import encode_delta  # noqa: E402
from weight_teleport.pipeline import PublisherConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber  # noqa: E402
from weight_teleport.pipeline.errors import ConfigError, ManifestSignatureError  # noqa: E402
from weight_teleport.format.manifest import Entry, Manifest, from_json, make_entry  # noqa: E402
from weight_teleport.format.signing import (
    ManifestSigner,
    ManifestVerifier,  # noqa: E402
    generate_keypair,
    key_id,
    public_key,
)
from weight_teleport.store import open_store  # noqa: E402
from weight_teleport.targets.torch import TorchTarget  # noqa: E402

PRIVATE, PUBLIC = generate_keypair()
OTHER_PRIVATE, OTHER_PUBLIC = generate_keypair()


def manifest() -> Manifest:
    return Manifest(
        (Entry(0, "snapshot", None, "packs/s0", 100, "ab" * 32), Entry(1, "delta", 0, "packs/d1", 10, "cd" * 32)),
        {"names": ["w"]},
    )


def signed(private: bytes = PRIVATE) -> bytes:
    return manifest().to_json(sign=ManifestSigner(private))


def test_signed_manifest_verifies_and_round_trips() -> None:
    assert from_json(signed(), verify=ManifestVerifier([PUBLIC])) == manifest()
    assert from_json(signed()) == manifest()  # readers without keys ignore the signature
    assert public_key(PRIVATE) == PUBLIC and len(key_id(PUBLIC)) == 16


def _tampered(data: bytes, change) -> bytes:
    doc = json.loads(data)
    change(doc)
    return json.dumps(doc, indent=1).encode()


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda d: d["entries"][1].update(sha256="ef" * 32), "does not match"),  # another pack
        (lambda d: d["entries"].pop(), "does not match"),  # history cut
        (lambda d: d["model"].update(names=["x"]), "does not match"),
        (lambda d: d.pop("signature"), "unsigned"),
        (lambda d: d["signature"].update(key_id="0" * 16), "not by a trusted key"),
        (lambda d: d["signature"].update(key_id=["0"]), "not by a trusted key"),  # not a name
        (lambda d: d["signature"].update(sig="not base64!"), "64 bytes"),
        (lambda d: d["signature"].update(alg="rsa"), "not an ed25519"),
        (lambda d: d.update(signature="x"), "not an ed25519"),
    ],
)
def test_tampered_manifests_are_refused(change, why: str) -> None:
    with pytest.raises(ManifestSignatureError, match=why):
        from_json(_tampered(signed(), change), verify=ManifestVerifier([PUBLIC]))


def test_other_keys_are_refused_and_rotation_accepts_both() -> None:
    with pytest.raises(ManifestSignatureError, match="not by a trusted key"):
        from_json(signed(OTHER_PRIVATE), verify=ManifestVerifier([PUBLIC]))
    both = ManifestVerifier([PUBLIC, OTHER_PUBLIC])
    assert from_json(signed(OTHER_PRIVATE), verify=both) == from_json(signed(), verify=both)


def test_pem_keys_and_configuration_errors() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(PRIVATE)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert from_json(signed(pem), verify=ManifestVerifier([pub_pem])) == manifest()
    with pytest.raises(ConfigError, match="signing_key"):
        Publisher("memory://signing-bad-key", PublisherConfig(signing_key=b"short"))
    with pytest.raises(ConfigError, match="trusted_keys"):
        Subscriber("memory://signing-bad-key", TorchTarget(zeros()), replace(FAST, trusted_keys=(b"not a key",)))


def test_a_signing_publisher_resumes_only_from_its_own_signatures(tmp_path: Path) -> None:
    """A store writer who appends a forged entry must not get it signed by the next
    publisher that resumes there."""
    url, store = f"file://{tmp_path}/store", None
    config = PublisherConfig(anchor_every=100, signing_key=PRIVATE)
    with Publisher(url, config) as pub:
        publish(pub, range(2))
    with Publisher(url, config) as pub:  # resumes from a signed manifest
        publish(pub, [2])
    store = open_store(url)
    good = from_json(store.get_manifest())
    forged = encode_delta(expected(2), zeros(), base_version=2, version=3)
    entry = make_entry(3, "delta", 2, forged, 0)
    store.put(entry.key, forged)
    store.put_manifest(good.with_entries(entry).to_json())
    with pytest.raises(ManifestSignatureError, match="resume=False"):
        Publisher(url, config)
    store.put_manifest(good.with_entries(entry).to_json(sign=ManifestSigner(OTHER_PRIVATE)))
    with pytest.raises(ManifestSignatureError, match="not by a trusted key"):
        Publisher(url, config)


def test_subscriber_refuses_what_a_store_writer_forges(tmp_path: Path) -> None:
    """Whoever can write the store (not the publisher's key) swaps in an unsigned manifest
    naming a forged pack, then a replayed older signed manifest, then swaps a pack's bytes
    under a signed manifest: all refused, the weights stay the publisher's."""
    url, live = f"file://{tmp_path}/store", zeros()
    store = open_store(url)
    config = replace(FAST, trusted_keys=(PUBLIC,))
    with (
        Publisher(url, PublisherConfig(anchor_every=100, signing_key=PRIVATE)) as pub,
        Subscriber(url, TorchTarget(live), config) as sub,
    ):
        publish(pub, range(2))
        old_signed = store.get_manifest()
        publish(pub, [2])
        follow_checked(sub, live, 2)
        good_raw = store.get_manifest()
        good = from_json(good_raw)

        forged = encode_delta(expected(2), zeros(), base_version=2, version=3)
        entry = make_entry(3, "delta", 2, forged, 0)
        store.put(entry.key, forged)
        store.put_manifest(good.with_entries(entry).to_json())  # unsigned
        until(lambda: "unsigned" in (sub.health.last_error or ""), "the unsigned manifest refused")
        store.put_manifest(old_signed)  # a valid, older signature
        until(lambda: "older" in (sub.health.last_error or ""), "the replayed manifest refused")
        time.sleep(0.2)
        assert sub.version == 2 and not sub.ready() and same_bits(live, 2)
        assert sub.health.state == "failing"

        # the store is repaired (its writes are conditional on the manifest the publisher
        # wrote last), and the publisher goes on
        store.put_manifest(good_raw)
        publish(pub, [3])
        signed_v3 = from_json(store.get_manifest())
        follow_checked(sub, live, 3)
        assert sub.health.state == "healthy"

        v4 = encode_delta(expected(3), expected(4), base_version=3, version=4)
        swapped = encode_delta(expected(3), zeros(), base_version=3, version=4)
        e4 = make_entry(4, "delta", 3, v4, 0)
        path = tmp_path / "store" / "objects" / e4.key  # other bytes under a
        path.parent.mkdir(parents=True, exist_ok=True)  # signed entry's key
        path.write_bytes(swapped)
        store.put_manifest(signed_v3.with_entries(e4).to_json(sign=ManifestSigner(PRIVATE)))
        until(lambda: sub.stats.objects_rejected >= 1, "the swapped pack rejected")
        assert sub.version == 3 and not sub.ready() and same_bits(live, 3)
