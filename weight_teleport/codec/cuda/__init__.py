"""The CUDA backend of the codec: Triton kernels over the tensors' device, the same pack format.

Needs `triton` (the `cuda` extra). Symbol streams are coded with the CPU stream coder
(zstd), so every pack this backend writes decodes on the CPU and the other way round."""
