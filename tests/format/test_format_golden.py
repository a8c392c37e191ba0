"""Golden bytes pin pack format v1: the exact bytes a small delta and snapshot encode to,
and what those stored bytes decode to. A change here is a format change (docs/FORMAT.md)."""

import numpy as np
import torch
from helpers import assert_bits_equal, from_bits

import weight_teleport as wt
from weight_teleport.codec import tensor_digest
from weight_teleport.codec import digest as D
from weight_teleport.codec.cpu.chunks import digest_sum
from weight_teleport.format import read_header

OLD_BITS = [
    0x3C00,
    0xBC00,
    0x0000,
    0x8000,
    0x7F80,
    0x7FC1,
    0x0001,
    0x3F80,
    0x4000,
    0xC040,
    0x3A00,
    0x1234,
    0x4321,
    0x0F0F,
    0xF0F0,
    0x3C01,
    0x3C02,
    0x3C03,
]
CHANGES = {0: 0x3C01, 3: 0x0000, 5: 0x7FC2, 9: 0xC03F, 17: 0x3C02}

GOLDEN_DELTA = bytes.fromhex(
    "5754504b01000000f30100009583254938000000000000007b226b696e64223a2264656c7461222c2276657273696f6e"
    "223a322c22626173655f76657273696f6e223a312c226368756e6b5f656c656d73223a382c2273747265616d5f636f64"
    "656373223a5b22726177222c227a737464225d2c2274656e736f7273223a5b7b226e616d65223a2277222c2264747970"
    "65223a2262666c6f61743136222c227368617065223a5b332c365d2c22636f646563223a22737061727365222c226469"
    "67657374223a2235393332373461316433316164303665222c226368616e676564223a352c22626173655f6469676573"
    "74223a2235313464363635356135326639383166222c22636c6173736573223a5b5b302c315d2c5b312c305d2c5b3132"
    "302c315d2c5b3132312c305d2c5b3132382c315d2c5b3132392c305d2c5b3235352c315d5d2c226368756e6b73223a5b"
    "5b302c32302c3136313339343435305d2c5b32302c31382c333930363537343130395d2c5b33382c31382c3139303935"
    "30373735315d5d7d2c7b226e616d65223a2269222c226474797065223a22696e743332222c227368617065223a5b335d"
    "2c22636f646563223a2273616d65222c22646967657374223a2238303065666561346466623063353765222c22636861"
    "6e676564223a302c22626173655f646967657374223a2238303065666561346466623063353765227d5d7d0200000304"
    "000303000000000000000000000a05020000010400010100000000000000000005020000010400010100000000000000"
    "000006"
)
GOLDEN_SNAPSHOT = bytes.fromhex(
    "5754504b010000001f010000c908414c3f000000000000007b226b696e64223a22736e617073686f74222c2276657273"
    "696f6e223a322c22626173655f76657273696f6e223a6e756c6c2c226368756e6b5f656c656d73223a382c2273747265"
    "616d5f636f64656373223a5b22726177222c227a737464225d2c2274656e736f7273223a5b7b226e616d65223a227722"
    "2c226474797065223a2262666c6f61743136222c227368617065223a5b332c365d2c22636f646563223a2264656e7365"
    "5f76616c756573222c22646967657374223a2235393332373461316433316164303665222c226368616e676564223a31"
    "382c226368756e6b73223a5b5b302c32352c313830323134393435335d2c5b32352c32352c323433393832333731375d"
    "2c5b35302c31332c333336333739383130305d5d7d5d7d0108020008080008080100000080c201803cbc00007f7f003f"
    "010802000808000808003f0034210ff00140c03a12430ff03c01020200020200020202023c3c"
)
GOLDEN_DENSE_RESIDUAL = (532, "3a8ad6d12feb8129e08b64378b55f712592a5b96b2ce25bbcd6e44166eedef39")
"""(length, sha256) of a delta whose tensor "w" is one `dense_residual` record (every element
steps up by 1 to 251: tests/codec/test_conformance.py's `_golden_pack`)."""


def _states():
    old_u = np.array(OLD_BITS, np.uint16)
    new_u = old_u.copy()
    for i, v in CHANGES.items():
        new_u[i] = v
    ints = torch.tensor([1, -2, 3], dtype=torch.int32)
    old = {"w": from_bits(old_u, torch.bfloat16, (3, 6)), "i": ints}
    new = {"w": from_bits(new_u, torch.bfloat16, (3, 6)), "i": ints.clone()}
    return old, new


def test_delta_encodes_to_golden_bytes():
    old, new = _states()
    assert wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=8) == GOLDEN_DELTA


def test_snapshot_encodes_to_golden_bytes():
    assert wt.encode_snapshot({"w": _states()[1]["w"]}, version=2, chunk_elems=8) == GOLDEN_SNAPSHOT


def test_golden_delta_decodes():
    old, new = _states()
    state = {k: v.clone() for k, v in old.items()}
    report = wt.apply_delta(state, GOLDEN_DELTA, base_version=1)
    assert_bits_equal(state, new)
    assert (report.version, report.elements_changed) == (2, 5)


def test_golden_snapshot_decodes():
    assert_bits_equal(wt.decode_snapshot(GOLDEN_SNAPSHOT), {"w": _states()[1]["w"]})


def test_golden_header_fields():
    h = read_header(GOLDEN_DELTA)
    assert (h.kind, h.version, h.base_version, h.chunk_elems) == ("delta", 2, 1, 8)
    assert [t.codec for t in h.tensors] == ["sparse", "same"]
    assert GOLDEN_DELTA[:8] == b"WTPK\x01\x00\x00\x00"


def _reference_digest(data: bytes) -> int:
    """The digest as docs/FORMAT.md defines it, in plain Python."""
    m = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    padded = data + bytes(-len(data) % 8)
    s = 0
    for j in range(len(padded) // 8):
        w = int.from_bytes(padded[8 * j : 8 * j + 8], "little")
        s = (s + mix(w ^ ((j * 0x9E3779B97F4A7C15) & m))) & m
    return (s + len(data) * 0xD6E8FEB86659FD93) & m


def test_digest_matches_reference_definition():
    rng = np.random.default_rng(0)
    for n in list(range(0, 40)) + [1000, 4099]:
        data = rng.integers(0, 256, size=n, dtype=np.uint8)
        assert D.finish(digest_sum(data, 0), n) == _reference_digest(data.tobytes()), n


def test_digest_golden_values():
    assert D.to_hex(_reference_digest(b"")) == "0000000000000000"
    assert D.to_hex(_reference_digest(bytes(range(20)))) == "c1c58eb16eb81625"


def test_tensor_digest_matches_pack_records():
    old, new = _states()
    header = read_header(GOLDEN_DELTA)
    for rec in header.tensors:
        assert tensor_digest(new[rec.name]) == rec.digest
        assert tensor_digest(old[rec.name]) == rec.base_digest
    assert tensor_digest(new["w"].t()) != header.tensors[0].digest  # bytes in row-major order
