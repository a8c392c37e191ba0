"""The vectorised reader of sparse chunks' stream tables (codec/cuda/tables.py, numpy only)
against the format's own reader."""

import numpy as np
import pytest
import torch
from test_codec_roundtrip import make_pair

import weight_teleport as wt
from weight_teleport.codec.cuda import tables
from weight_teleport.errors import PackFormatError
from weight_teleport.format import read_groups, read_header


def _sparse_refs(pack: bytes):
    header = read_header(pack)
    refs = [(t, ref) for t in header.tensors if t.codec == "sparse" for ref in t.chunks]
    k = np.array([max(c for _, c in t.classes) + 1 for t, _ in refs], np.int64)
    starts = np.array([header.payload_offset + r.offset for _, r in refs], np.int64)
    lengths = np.array([r.length for _, r in refs], np.int64)
    return refs, k, starts, lengths


@pytest.mark.parametrize("typical", [tables.TYPICAL_BYTES, 0])
@pytest.mark.parametrize("dtype,shape,chunk,p", [(torch.float32, (300, 41), 512, 0.05),
                                                 (torch.bfloat16, (300, 1000), 1 << 16, 0.2)])
def test_stream_tables_match_the_format_reader(dtype, shape, chunk, p, typical, monkeypatch):
    """Tables read from the first window, and (first windows of one byte) read again."""
    monkeypatch.setattr(tables, "TYPICAL_BYTES", typical)
    old, new = make_pair(11, dtype, shape, "weights", "density", "ulp", p)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=chunk)
    refs, k, starts, lengths = _sparse_refs(pack)
    assert refs
    st = tables.read(np.frombuffer(pack, np.uint8), starts, lengths, k, 16)
    for i, (t, ref) in enumerate(refs):
        start = ref.offset + read_header(pack).payload_offset
        for c, g in enumerate(read_groups(pack[start:start + ref.length])):
            row = i * 16 + c
            assert st.events[row] == (g.count if g.streams else 0)
            for j, s in enumerate(g.streams):
                assert (st.codec[row, j], st.raw[row, j]) == (s.codec, s.raw_len)
                assert pack[st.at[row, j]:st.at[row, j] + st.stored[row, j]] == bytes(s.data)


def test_truncated_table_is_refused():
    old, new = make_pair(12, torch.float32, (300, 41), "weights", "density", "ulp", 0.05)
    pack = wt.encode_delta({"w": old}, {"w": new}, base_version=0, version=1, chunk_elems=512)
    refs, k, starts, lengths = _sparse_refs(pack)
    with pytest.raises(PackFormatError):
        tables.read(np.frombuffer(pack, np.uint8), starts, np.minimum(lengths, 3), k, 16)
