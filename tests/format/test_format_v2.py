"""Format version 2: golden bytes of records over boxes (a column walk, chunk cuts, chunk
digests), and typed errors for every malformed field of version 2."""

import pytest
import torch
from helpers import assert_bits_equal
from hostile import chunks_of, framed, header_json, with_chunks
from test_format_golden import _states

import weight_teleport as wt
from weight_teleport.codec import Hint, TensorSlice
from weight_teleport.errors import PackFormatError, UnsupportedFormatError
from weight_teleport.format import read_header

GOLDEN_V2 = bytes.fromhex(
    "5754504b0200000051030000323080974a000000000000007b226b696e64223a2264656c7461222c2276657273696f6e"
    "223a322c22626173655f76657273696f6e223a312c226368756e6b5f656c656d73223a31362c2273747265616d5f636f"
    "64656373223a5b22726177222c227a737464225d2c2274656e736f7273223a5b7b226e616d65223a2277222c22647479"
    "7065223a2262666c6f61743136222c227368617065223a5b362c365d2c22636f646563223a22737061727365222c2264"
    "6967657374223a2266313437613831303663373032653261222c226368616e676564223a352c22626173655f64696765"
    "7374223a2263346561653066333939303062646635222c22636c6173736573223a5b5b302c315d2c5b312c305d2c5b31"
    "32302c315d2c5b3132312c305d2c5b3132382c315d2c5b3132392c305d2c5b3235352c315d5d2c226368756e6b73223a"
    "5b5b302c32322c333536303634353235335d2c5b32322c31382c343032313537323335365d5d2c22626f78223a5b5b33"
    "2c335d2c5b302c365d5d2c226f72646572223a22636f6c73222c226368756e6b5f64696765737473223a5b2239343836"
    "646164383233653065383230222c2235636330636433383438386634363061225d2c226368756e6b5f626173655f6469"
    "6765737473223a5b2232353139363138663963663534376366222c2239666431376636336663306237363236225d7d2c"
    "7b226e616d65223a2276222c226474797065223a2275696e7438222c227368617065223a5b34305d2c22636f64656322"
    "3a22737061727365222c22646967657374223a2233333235383039383061386262643736222c226368616e676564223a"
    "332c22626173655f646967657374223a2235366161323233666663306138643830222c22636c6173736573223a5b5b30"
    "2c305d5d2c226368756e6b73223a5b5b34302c31362c333336383431333436335d2c5b35362c31382c36303334373837"
    "31375d5d2c22626f78223a5b5b382c32345d5d2c2263757473223a5b382c31365d2c226368756e6b5f64696765737473"
    "223a5b2235623436393031343333646530336366222c2264376465663038336436616462396137225d2c226368756e6b"
    "5f626173655f64696765737473223a5b2261633930353334383630396132396265222c22616131396365663739623730"
    "36336332225d7d5d7d0200000404000404000101000000000000000f000f010200000104000101000000000000000000"
    "0101010400010100000000000000000005010204000202000101000000000000051903"
)


def v2_states():
    old, new = _states()
    v_old = (torch.arange(24) * 7 % 251).to(torch.uint8)
    v_new = v_old.clone()
    v_new[[1, 9, 20]] += 1
    return {"w": old["w"], "v": v_old}, {"w": new["w"], "v": v_new}


def v2_pack(old, new) -> bytes:
    """`w` is rows 3..5 of a 6x6 tensor walked by columns, `v` elements 8..31 of a vector of 40
    cut at element 16 (a receiver's bound)."""
    slices = {"w": TensorSlice((6, 6), [(3, 3), (0, 6)]), "v": TensorSlice((40,), [(8, 24)])}
    hints = {"w": Hint("cols"), "v": Hint("rows", (16,))}
    return wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=16, slices=slices, hints=hints)


def test_v2_delta_encodes_to_golden_bytes_and_decodes():
    old, new = v2_states()
    assert v2_pack(old, new) == GOLDEN_V2
    h = read_header(GOLDEN_V2)
    w, v = h.tensors
    assert h.format_version == 2 and w.order == "cols" and v.cuts == [8, 16] and len(v.chunk_digests) == 2
    live = {"w": torch.zeros(6, 6, dtype=torch.bfloat16), "v": torch.zeros(40, dtype=torch.uint8)}
    live["w"][3:] = old["w"]
    live["v"][8:32] = old["v"]
    wt.apply_delta(live, GOLDEN_V2)
    assert_bits_equal({"w": live["w"][3:], "v": live["v"][8:32]}, new)


def _edited(edit) -> bytes:
    h = header_json(GOLDEN_V2)
    edit(h["tensors"])
    return framed(*with_chunks(h, chunks_of(GOLDEN_V2)))


def _set(i, field, value):
    return lambda recs: recs[i].__setitem__(field, value)


@pytest.mark.parametrize(
    "edit, error, message",
    [
        (_set(0, "box", [[3, 3]]), PackFormatError, "box of 1 dimensions"),
        (_set(0, "box", [[4, 3], [0, 6]]), PackFormatError, "outside its shape"),
        (_set(0, "box", [[-1, 3], [0, 6]]), PackFormatError, "malformed"),
        (_set(0, "box", [[3, 3, 1], [0, 6]]), PackFormatError, "malformed"),
        (_set(0, "box", [[3, 3], [0, 10**30]]), PackFormatError, ""),
        (_set(0, "order", "diagonal"), UnsupportedFormatError, "walk order"),
        (_set(0, "order", 1), PackFormatError, "malformed"),
        (_set(1, "cuts", [8, 8, 8]), PackFormatError, "chunks, expected|digests for"),
        (_set(1, "cuts", [4, 20]), PackFormatError, "multiple of 8"),
        (_set(1, "cuts", [8, 8]), PackFormatError, "adding up to"),
        (_set(1, "cuts", [0, 24]), PackFormatError, r"outside \[1"),
        (_set(1, "cuts", [8, 1 << 23]), PackFormatError, r"outside \[1"),
        (_set(1, "chunk_digests", ["0" * 16]), PackFormatError, "1 chunk_digests for 2"),
        (_set(1, "chunk_digests", ["0" * 16, "g" * 16]), PackFormatError, "hex"),
        (_set(1, "chunk_digests", ["0" * 16, "0" * 16]), PackFormatError, "add up"),
        (_set(1, "chunk_base_digests", []), PackFormatError, "only together"),
        (_set(1, "chunk_base_digests", ["1" * 16, "2" * 16]), PackFormatError, "add up"),
        (_set(1, "chunk_digests", [1, 2]), PackFormatError, "malformed"),
    ],
)
def test_malformed_v2_fields_raise_typed_errors(edit, error, message):
    with pytest.raises(error, match=message):
        read_header(_edited(edit))


def test_a_version_1_pack_with_fields_of_version_2_is_refused():
    h = header_json(GOLDEN_V2)
    pack = framed(*with_chunks(h, chunks_of(GOLDEN_V2)))
    bad = bytearray(pack)
    bad[4] = 1
    with pytest.raises(PackFormatError, match="fields of format version 2 in a version 1 pack"):
        read_header(bytes(bad))


def test_cuts_on_an_unchanged_record_and_base_digests_of_a_snapshot_are_refused():
    old, new = v2_states()
    same = {"w": new["w"], "v": old["v"]}
    pack = wt.encode_delta(old, same, base_version=1, version=2, slices={"v": TensorSlice((24,), [(0, 24)])})
    h = header_json(pack)
    h["tensors"][1]["cuts"] = [24]
    with pytest.raises(PackFormatError, match="codec 'same' and cuts"):
        read_header(framed(*with_chunks(h, chunks_of(pack))))
    snap = wt.encode_snapshot(new, version=2, slices={"v": TensorSlice((40,), [(8, 24)])})
    h = header_json(snap)
    h["tensors"][1]["chunk_base_digests"] = h["tensors"][1]["chunk_digests"]
    with pytest.raises(PackFormatError, match="snapshot has chunk_base_digests"):
        read_header(framed(*with_chunks(h, chunks_of(snap))))
