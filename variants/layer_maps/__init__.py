"""Per-layer maps shared by the model TOML and the families: ``--bits-map``
(quant) and ``--ratio-map`` (lowrank). No MLX."""
