"""CudaCodecConfig's one `stream_coder` choice, the deprecated flags it replaces, and the
choice of the coder that runs (codec/cuda/choice.py): plain Python, no GPU needed."""

import pytest
import torch

from weight_teleport.codec.cuda.config import STREAM_CODERS, CudaCodecConfig

LEGACY = [
    ({}, "huffman"),
    ({"huffman": False}, "nvcomp-zstd"),
    ({"use_nvcomp": False}, "cpu-zstd"),
    ({"algorithm": "lz4", "use_nvcomp": False}, "cpu-zstd"),
    ({"algorithm": "lz4"}, "nvcomp-lz4"),
    ({"algorithm": "ans", "huffman": False}, "nvcomp-ans"),
    ({"algorithm": "zstd", "huffman": True}, "huffman"),
]


@pytest.mark.parametrize("flags, coder", LEGACY)
def test_the_deprecated_flags_map_to_one_stream_coder(flags, coder):
    if flags:
        with pytest.warns(DeprecationWarning, match=f"stream_coder='{coder}'"):
            cfg = CudaCodecConfig(**flags)
    else:
        cfg = CudaCodecConfig()
    assert cfg == CudaCodecConfig(stream_coder=coder)
    assert cfg.portable == (coder in ("huffman", "nvcomp-zstd", "cpu-zstd"))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="stream_coder must be one of"):
        CudaCodecConfig(stream_coder="zstd")
    with pytest.raises(ValueError, match="not with the deprecated"):
        CudaCodecConfig(stream_coder="cpu-zstd", use_nvcomp=False)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        CudaCodecConfig(algorithm="snappy")
    with pytest.raises(ValueError, match="decompress_backend"):
        CudaCodecConfig(decompress_backend="fast")


def test_the_coder_that_runs(monkeypatch):
    pytest.importorskip("triton")
    from weight_teleport.codec.cuda import choice
    from weight_teleport.codec.cuda.zstd_literals import gpu_writer

    buf = torch.zeros(16, dtype=torch.uint8)
    for writer, nvcomp, want in (
        (True, True, ["huffman", "nvcomp-zstd", "nvcomp-lz4", "nvcomp-ans", "cpu-zstd"]),
        (False, True, ["nvcomp-zstd", "nvcomp-zstd", "nvcomp-lz4", "nvcomp-ans", "cpu-zstd"]),
        (False, False, ["cpu-zstd", "cpu-zstd", None, None, "cpu-zstd"]),
    ):
        monkeypatch.setattr(gpu_writer, "available", lambda t, w=writer: w)
        monkeypatch.setattr(choice, "nvcomp_found", lambda n=nvcomp: n)
        for coder, expect in zip(STREAM_CODERS, want):
            cfg = CudaCodecConfig(stream_coder=coder)
            if expect is None:
                with pytest.raises(RuntimeError, match="needs nvCOMP"):
                    choice.stream_coder(cfg, buf)
            else:
                assert choice.stream_coder(cfg, buf) == expect, (writer, nvcomp, coder)
