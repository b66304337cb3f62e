"""Data: the bundled VADER corpora, a user's own data files and their schema, labels,
deterministic splits, and the task sets a decision model reads."""
