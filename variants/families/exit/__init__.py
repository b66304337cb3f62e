"""The exit family: early exit with distilled heads and a confidence rule
(entry, heads, rules, network, build)."""
