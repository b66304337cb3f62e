"""The quant family: round-to-nearest group-wise quantization (config, entry, build)."""
