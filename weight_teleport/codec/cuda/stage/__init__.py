"""The sampler's side of the CUDA backend: packs decoded and verified on the GPU, then applied."""
