"""What the CUDA kernels run on: NVRTC compilation and launches, the nvCOMP binding,
device checks and pinned host memory."""
