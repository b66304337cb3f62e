"""The student family's names shared by its entry (:mod:`variants.builders.student_family`) and
its training (:mod:`variants.builders.student_train`). No MLX."""

#: texts per training step (and per reference forward over the training texts)
TRAIN_BATCH = 32
