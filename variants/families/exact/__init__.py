"""The exact family: deduplication and a result cache, exact by construction
(entry, keys, workload, output selection, build)."""
