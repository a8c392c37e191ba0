"""The CUDA C warp kernels (codec/cuda/kernels/warp.cu) and symbol coder (codec/cuda/kernels/encode_symbols.cu)
compile with NVRTC for every element type, and the Huffman frame writer
(codec/cuda/zstd_literals/huffman.cu) and the CRC kernel (codec/cuda/kernels/crc.cu) compile, no GPU needed (NVRTC comes
with the test extra's `nvidia-cuda-nvrtc` wheel): a slip in the CUDA source fails here, not
only on a GPU."""

import pytest
import torch
from helpers import DTYPES

from weight_teleport.codec.cuda.kernels import crc, encode_symbols, warp
from weight_teleport.codec.cuda.runtime import nvrtc
from weight_teleport.codec.cuda.zstd_literals import gpu_writer
from weight_teleport.codec.cuda.kernels.class_ranks import WARP_BLOCK, pow2
from weight_teleport.codec.cuda.kernels.encode_scan import SPAN
from weight_teleport.codec.dtypes import dtype_info


@pytest.fixture
def nvrtc_found(monkeypatch):
    """NVRTC of CUDA 13, found in the wheel when torch is a CPU build."""
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "13.0")
    nvrtc._nvrtc.cache_clear()
    try:
        nvrtc._nvrtc()
    except OSError:
        pytest.skip("no NVRTC library (install the test extra)")
    yield
    nvrtc._nvrtc.cache_clear()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_kernel_compiles_for_every_element_type(dtype, nvrtc_found):
    info = dtype_info(dtype)
    source = warp.source()  # with the static_asserts of its parameter structs' host mirrors
    nb = pow2(2 * (1 << info.exponent_bits))
    for block, unroll in ((1024, None), (WARP_BLOCK, None), (SPAN, None), (SPAN, 8)):  # 8: the scan's
        options = [f"-D{k}={int(v)}" for k, v in warp._defines(info, block, unroll, NCP=16, NB=nb)]
        # the events kernel copies with cp.async from 8.0 on, with loads and stores before it
        for capability in (75, 90) if (block, unroll) == (SPAN, None) else (90,):
            image = nvrtc.compile_image(source, "warp.cu", capability, options)
            assert image[:4] == b"\x7fELF"
            for kernel in (b"class_counts", b"hist_counts", b"class_events", b"scan_words"):
                assert kernel in image
            assert (b"place_lanes" in image) == (block in (1024, 2048))  # the stage's blocks
    options = encode_symbols._module(info.bits).options  # the defines encode_symbols.py launches it with
    for capability in (75, 90):
        image = nvrtc.compile_image(encode_symbols.SOURCE.read_text(), "encode_symbols.cu", capability, options)
        assert image[:4] == b"\x7fELF" and b"segment_counts" in image and b"segment_symbols" in image


def test_a_drifted_parameter_struct_fails_to_compile(nvrtc_found):
    """The static_assert appended to warp.cu catches a struct that lost a field (the
    order of the fields is checked on the host by tests/codec/test_kernel_params.py)."""
    info = dtype_info(torch.bfloat16)
    options = [f"-D{k}={int(v)}" for k, v in warp._defines(info, 1024, None, NCP=16, NB=512)]
    drifted = warp.source().replace("    int* pos;\n    U* val;\n", "    U* val;\n", 1)
    assert drifted != warp.source()
    with pytest.raises(RuntimeError, match="PlaceParams: size differs from its host mirror"):
        nvrtc.compile_image(drifted, "warp.cu", 90, options)


@pytest.mark.parametrize("capability", [75, 90])  # warp reductions by shuffles before 8.0
def test_the_huffman_writer_compiles(capability, nvrtc_found):
    image = nvrtc.compile_image(gpu_writer.SOURCE.read_text(), "huffman.cu", capability, gpu_writer._module().options)
    assert image[:4] == b"\x7fELF" and b"huf_plan" in image and b"huf_write" in image


@pytest.mark.parametrize("capability", [75, 90])
def test_the_crc_kernel_compiles(capability, nvrtc_found):
    image = nvrtc.compile_image(crc.SOURCE.read_text(), "crc.cu", capability, crc._module().options)
    assert image[:4] == b"\x7fELF" and b"crc_ranges" in image


def test_a_gpu_newer_than_nvrtc_gets_ptx(nvrtc_found):
    newest = max(nvrtc._supported_archs())
    image = nvrtc.compile_image('extern "C" __global__ void f(int* x) { x[0] = 1; }', "f.cu", newest + 1000, [])
    assert f".target sm_{newest}".encode() in image and image.endswith(b"\0")


def test_compile_errors_name_the_line(nvrtc_found):
    with pytest.raises(RuntimeError, match='identifier "oops" is undefined'):
        nvrtc.compile_image('extern "C" __global__ void f() { oops; }', "bad.cu", 90, [])
    with pytest.raises(RuntimeError, match="none of the compute capabilities"):
        nvrtc.compile_image("", "old.cu", 10, [])
