"""The student family's names shared by its entry (:mod:`variants.families.student.family`) and
its training (:mod:`variants.families.student.train`). No MLX."""

#: texts per training step (and per reference forward over the training texts)
TRAIN_BATCH = 32
