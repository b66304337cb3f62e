"""The w8a8 family's names shared by its entry (:mod:`variants.families.w8a8.family`) and its
MLX build (:mod:`variants.families.w8a8.build`). No MLX."""

#: the α grid searched per input site (SmoothQuant's paper sweeps 0.4-0.9; 0 = no migration)
ALPHAS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
