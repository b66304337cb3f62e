"""The CPU runtime under every architecture: OpenBLAS preload, MLX device and streams,
row packing, fused and compiled ops (``qkernel/``), quantized Linears, and the
alternated timing of a forward."""
