"""Zstandard frames of Huffman-coded literals: the GPU writer and its CPU reference."""
