"""Benchmarks: simulated RL deltas, peer codecs, entropy bounds and the harness."""
