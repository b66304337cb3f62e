"""The prune family's names shared by its entry (:mod:`variants.builders.prune_family`) and its
MLX build (:mod:`variants.builders.prune`). No MLX."""

#: token importance scores (--prune-scores)
SCORES = ("received", "cls")
#: tokens never pruned (BERT's); ModernBERT's ``<s>``/``</s>`` pair is added by the build
PROTECTED_TOKENS = ("[CLS]", "[SEP]")
