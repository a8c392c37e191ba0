"""The stream coder an encode call uses, decided once per call from its CudaCodecConfig and
the libraries this machine has."""

import torch

from weight_teleport.codec.cuda.config import CudaCodecConfig
from weight_teleport.codec.cuda.runtime import nvcomp
from weight_teleport.codec.cuda.zstd_literals import gpu_writer


def nvcomp_found() -> bool:
    """Whether nvCOMP's library loads (the `cuda` extra)."""
    return nvcomp.available()


def stream_coder(config: CudaCodecConfig, buffer: torch.Tensor) -> str:
    """The coder that stores the symbol streams in `buffer`: `config.stream_coder` where it
    can run; a portable one falls back from 'huffman' (no NVRTC for the GPU) to
    'nvcomp-zstd', and from that (no nvCOMP) to 'cpu-zstd', all of them packs the CPU reads.
    RuntimeError for a GPU-only coder without nvCOMP."""
    coder = config.stream_coder
    if not config.portable and not nvcomp_found():
        raise RuntimeError(f"stream coder {coder!r} needs nvCOMP: pip install 'weight-teleport[cuda]'")
    if coder == "huffman" and not gpu_writer.available(buffer):
        coder = "nvcomp-zstd"
    if coder == "nvcomp-zstd" and not nvcomp_found():
        coder = "cpu-zstd"
    return coder
