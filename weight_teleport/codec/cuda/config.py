"""Configuration of the CUDA backend's stream coding (a dataclass that does no I/O)."""

from dataclasses import dataclass

ALGORITHMS = ("zstd", "lz4", "ans")
BACKENDS = ("default", "hardware", "cuda")


@dataclass(frozen=True)
class CudaCodecConfig:
    """How the CUDA backend entropy-codes and decodes the symbol streams of a pack."""

    algorithm: str = "zstd"
    """nvCOMP stream codec: 'zstd' (portable: the CPU reads it), 'lz4' (stream codec id 2;
    the CPU refuses it) or 'ans' (nvCOMP's own format, id 3, GPU only)."""
    decompress_backend: str = "default"
    """nvCOMP decompression backend: 'default', 'cuda', or 'hardware' (the decompression
    engine of Blackwell GPUs, for LZ4; it raises on Hopper)."""
    use_nvcomp: bool = True
    """Code streams on the GPU (zstd: our frame writer, or nvCOMP with huffman=False; lz4 and
    ans: nvCOMP); False codes them with the CPU's zstd, which writes packs byte-identical to
    the CPU backend's."""
    huffman: bool = True
    """With 'zstd': write each stream as zstd frames of Huffman-coded literals on the GPU
    (codec/cuda/zstd_literals/reference.py; no nvCOMP needed). False: nvCOMP's zstd compressor."""

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.decompress_backend not in BACKENDS:
            raise ValueError(f"decompress_backend must be one of {BACKENDS}, got {self.decompress_backend!r}")

    @property
    def portable(self) -> bool:
        """Whether the CPU can decode the packs written with this configuration."""
        return self.algorithm == "zstd" or not self.use_nvcomp
