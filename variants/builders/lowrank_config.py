"""The lowrank family's names shared by its entry (:mod:`variants.builders.lowrank_family`) and
its factorisation (:mod:`variants.builders.lowrank_math`, :mod:`variants.builders.lowrank`). No
MLX."""

#: factorisations: plain SVD, SVD-LLM whitened, ASVD activation-scaled
METHODS = ("plain", "whitened", "scaled")
#: per-layer rank rules (:class:`variants.builders.lowrank_family.LowRankConfig`)
RULES = ("params", "energy", "rank")
