"""runs: everything that reads and writes a results folder and judges from saved files (no MLX).

Layers, bottom up: ``metrics`` (pure NumPy/SciPy) < ``contracts`` (contract files, checker,
per-variant report) < ``runs`` (results folder I/O, judge, selftest, run-level report, plots,
the ``check``/``selftest``/``plot`` commands) < ``variants`` (models, builders, the sweep). A
package imports only packages below it; nothing here imports ``mlx`` or ``variants``.
"""
