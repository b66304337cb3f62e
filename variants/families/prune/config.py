"""The prune family's names shared by its entry (:mod:`variants.families.prune.family`) and its
MLX build (:mod:`variants.families.prune.build`). No MLX."""

#: token importance scores (--prune-scores)
SCORES = ("received", "cls")
#: tokens never pruned (BERT's); ModernBERT's ``<s>``/``</s>`` pair is added by the build
PROTECTED_TOKENS = ("[CLS]", "[SEP]")
