"""The lowrank family's names shared by its entry (:mod:`variants.families.lowrank.family`) and
its factorisation (:mod:`variants.families.lowrank.factorise`, :mod:`variants.families.lowrank.build`). No
MLX."""

#: factorisations: plain SVD, SVD-LLM whitened, ASVD activation-scaled
METHODS = ("plain", "whitened", "scaled")
#: per-layer rank rules (:class:`variants.families.lowrank.family.LowRankConfig`)
RULES = ("params", "energy", "rank")
