"""The student family: a distilled shallower encoder with teacher fallback
(config, entry, training, network, fallback, build)."""
