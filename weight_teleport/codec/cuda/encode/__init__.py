"""The trainer's side of the CUDA backend: deltas and snapshots of CUDA tensors written as packs."""
