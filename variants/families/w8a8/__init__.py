"""The w8a8 family: int8 weights and per-token int8 activations with SmoothQuant
migration (config, entry, build)."""
