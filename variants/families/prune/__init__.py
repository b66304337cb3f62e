"""The prune family: PoWER-BERT style token pruning (config, entry, build)."""
