"""The host mirrors of the CUDA kernels' parameter structs (codec/cuda/runtime/params.py) match
the structs declared in the CUDA source, field for field, by name, kind, offset and size: read
off the source here, no GPU or NVRTC needed (tests/codec/test_codec_warp_compile.py also compiles
the mirrors' static_asserts with NVRTC)."""

import ctypes

import pytest
import torch

pytest.importorskip("triton")

from weight_teleport.codec.cuda.kernels import warp  # noqa: E402
from weight_teleport.codec.cuda.runtime import params  # noqa: E402

MIRRORS = [(warp.SOURCE, p) for p in warp.PARAMS]


@pytest.mark.parametrize("source, mirror", MIRRORS, ids=[m.CUDA_NAME for _, m in MIRRORS])
def test_mirror_matches_the_declared_struct(source, mirror):
    text = source.read_text()
    declared = params.declared_fields(text, mirror.CUDA_NAME)
    assert [n for n, _ in mirror._fields_] == [n for _, n in declared]
    for (name, kind), (ctype, _) in zip(mirror._fields_, declared):
        assert (kind is params.POINTER) == ctype.endswith("*"), (name, ctype)
        assert kind in (params.POINTER, params.I64), name
    layout, size = params.declared_layout(text, mirror.CUDA_NAME)
    assert [(n, getattr(mirror, n).offset, getattr(mirror, n).size) for n, _ in mirror._fields_] == layout
    assert ctypes.sizeof(mirror) == size


@pytest.mark.parametrize("source, mirror", MIRRORS, ids=[m.CUDA_NAME for _, m in MIRRORS])
def test_the_kernel_takes_the_struct(source, mirror):
    text = source.read_text()
    assert f"(const {mirror.CUDA_NAME} prm)" in text
    assert mirror.layout_checks() in warp.source()


def test_the_parser_sees_a_drifted_declaration():
    text = warp.SOURCE.read_text()
    swapped = text.replace("    int* pos;\n    U* val;\n", "    U* val;\n    int* pos;\n", 1)
    assert swapped != text
    names = [n for _, n in params.declared_fields(swapped, "PlaceParams")]
    assert names != [n for n, _ in warp.PlaceParams._fields_]
    narrowed = text.replace("    i64 n_words;\n", "    int n_words;\n", 1)
    assert params.declared_layout(narrowed, "PlaceParams") != params.declared_layout(text, "PlaceParams")


def test_params_are_set_by_name_and_kind():
    t = torch.zeros(4, dtype=torch.int64)
    fields = {n: (t if k is params.POINTER else 3) for n, k in warp.EventParams._fields_}
    p = warp.EventParams.of(**fields)
    assert p.old == t.data_ptr() and p.programs == 3
    with pytest.raises(TypeError, match="missing fields"):
        warp.EventParams.of(**{k: v for k, v in fields.items() if k != "roff"})
    with pytest.raises(TypeError, match="unknown fields"):
        warp.EventParams.of(**fields, extra=t)
    with pytest.raises(TypeError, match="takes a tensor"):
        warp.EventParams.of(**{**fields, "rows": 5})
    with pytest.raises(TypeError, match="takes an int"):
        warp.EventParams.of(**{**fields, "programs": t})
