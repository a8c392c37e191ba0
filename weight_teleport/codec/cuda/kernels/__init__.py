"""The CUDA backend's kernels, one module per kernel family (Triton, and CUDA C beside it
compiled with NVRTC); `encode_*` serve the trainer, `stage_*` the sampler, the rest both."""
