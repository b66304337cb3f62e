"""The lowrank family: SVD-LLM whitened, plain and ASVD scaled factorisation
(config, entry, factorisation, build)."""
