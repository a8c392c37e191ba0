"""The CUDA backend of the codec: CUDA C warp kernels (compiled at first use with NVRTC),
Triton kernels and torch ops over the tensors' device, the same pack format.

Needs `triton`; stream coding uses nvCOMP (`nvidia-libnvcomp-cu13`, the `cuda` extra) when
it is installed and the CPU's zstd otherwise. With the default `CudaCodecConfig` (zstd)
every pack decodes on the CPU; 'lz4' and 'ans' write GPU-side stream codecs that the header
names: a CPU reader refuses them, CUDA weights decode them with nvCOMP."""
