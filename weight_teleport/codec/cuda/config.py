"""Configuration of the CUDA backend's stream coding (a dataclass that does no I/O)."""

import warnings
from dataclasses import InitVar, dataclass

STREAM_CODERS = ("huffman", "nvcomp-zstd", "nvcomp-lz4", "nvcomp-ans", "cpu-zstd")
PORTABLE_CODERS = ("huffman", "nvcomp-zstd", "cpu-zstd")
"""The stream coders whose packs the CPU backend decodes (zstd frames or raw streams)."""
NVCOMP_ALGORITHM = {"nvcomp-zstd": "zstd", "nvcomp-lz4": "lz4", "nvcomp-ans": "ans"}
"""The nvCOMP algorithm of each stream coder that runs nvCOMP."""
BACKENDS = ("default", "hardware", "cuda")


def legacy_stream_coder(algorithm: str | None, use_nvcomp: bool | None, huffman: bool | None) -> str:
    """The stream coder the deprecated `algorithm` / `use_nvcomp` / `huffman` flags chose."""
    algorithm = "zstd" if algorithm is None else algorithm
    if algorithm not in ("zstd", "lz4", "ans"):
        raise ValueError(f"algorithm must be one of ('zstd', 'lz4', 'ans'), got {algorithm!r}")
    if use_nvcomp is False:
        return "cpu-zstd"
    if algorithm == "zstd":
        return "nvcomp-zstd" if huffman is False else "huffman"
    return f"nvcomp-{algorithm}"


@dataclass(frozen=True)
class CudaCodecConfig:
    """How the CUDA backend entropy-codes and decodes the symbol streams of a pack."""

    stream_coder: str = "huffman"
    """How the encoder stores each symbol stream (a stream stays raw where coding does not
    make it smaller):
    'huffman': zstd frames of Huffman-coded literals written on the GPU
      (codec/cuda/zstd_literals; no nvCOMP needed); portable: the CPU reads them.
    'nvcomp-zstd': nvCOMP's zstd compressor; portable.
    'nvcomp-lz4': nvCOMP's LZ4 (stream codec id 2): GPU only, the CPU refuses it.
    'nvcomp-ans': nvCOMP's ANS (its own format, id 3): GPU only.
    'cpu-zstd': the CPU's zstd, which writes packs byte-identical to the CPU backend's.
    Where 'huffman' cannot run (no NVRTC for the GPU) the encoder uses nvCOMP's zstd, and
    where nvCOMP is missing too the CPU's zstd; the GPU-only coders need nvCOMP."""
    decompress_backend: str = "default"
    """nvCOMP decompression backend: 'default', 'cuda', or 'hardware' (the decompression
    engine of Blackwell GPUs, for LZ4; it raises on Hopper)."""
    algorithm: InitVar[str | None] = None
    """Deprecated (use `stream_coder`): nvCOMP algorithm 'zstd', 'lz4' or 'ans'."""
    use_nvcomp: InitVar[bool | None] = None
    """Deprecated (use `stream_coder`): False meant 'cpu-zstd'."""
    huffman: InitVar[bool | None] = None
    """Deprecated (use `stream_coder`): False with 'zstd' meant 'nvcomp-zstd'."""

    def __post_init__(self, algorithm, use_nvcomp, huffman):
        if (algorithm, use_nvcomp, huffman) != (None, None, None):
            if self.stream_coder != "huffman":
                raise ValueError(
                    "give `stream_coder` alone, not with the deprecated algorithm / use_nvcomp / huffman flags"
                )
            coder = legacy_stream_coder(algorithm, use_nvcomp, huffman)
            warnings.warn(
                f"CudaCodecConfig's algorithm / use_nvcomp / huffman flags are deprecated: use "
                f"CudaCodecConfig(stream_coder={coder!r})",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "stream_coder", coder)
        if self.stream_coder not in STREAM_CODERS:
            raise ValueError(f"stream_coder must be one of {STREAM_CODERS}, got {self.stream_coder!r}")
        if self.decompress_backend not in BACKENDS:
            raise ValueError(f"decompress_backend must be one of {BACKENDS}, got {self.decompress_backend!r}")

    @property
    def portable(self) -> bool:
        """Whether the CPU can decode the packs written with this configuration."""
        return self.stream_coder in PORTABLE_CODERS
