"""One module per ``variants`` verb that lives on the model side (``sweep``, ``list``); the
entry point :mod:`variants.cli` imports a verb's module only when that verb runs. Imports no
MLX."""

EXIT_OK, EXIT_FAILURE, EXIT_USER_ERROR = 0, 1, 2  # 1: a violation (--fail-on-violation) or
# an output that could not be written (variants.io.WriteError, sweep.RunIncomplete)
