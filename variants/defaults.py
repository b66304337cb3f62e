"""The command line's defaults, in one table: ``variants sweep``, ``variants search`` and
``variants sensitivity`` (and :class:`variants.sweep.config.SweepConfig`,
:class:`variants.search.driver.SearchOptions`, :mod:`variants.runtime.timing`) read them from here, so a
setting two commands share has one default. Plain Python: no MLX import.

Timing (docs/method.md: 5 warm-ups, 50 timed rounds) and cold starts are the sweep's; the
search's finalists are judged as sweep variants and timed with the same values. Candidate
widths differ on purpose and carry their own names: a sweep builds one variant per width of
:data:`QUANT_BITS`, and the sensitivity table measures each of them, while a search starts every
layer at the lowest of :data:`SEARCH_BITS` and raises layers one width at a time, so starting
at 2 bits would spend its ``--max-candidates`` on raises out of the 2- and 3-bit widths.
"""

#: examples per split (sweep, search, sensitivity's reference head)
N_FIT = 2000
N_CALIBRATION = 800
N_EVAL = 800
#: seed of the data subsample (and of the search's optuna sampler)
SEED = 0
RESULTS_DIR = "results"

#: alternated timing rounds wanted per batch size, untimed warm-ups per model and batch size,
#: seconds per measurement after which no new round starts, rounds run even past it
TIMING_ROUNDS = 50
TIMING_WARMUP = 5
TIMING_BUDGET_S = 30.0
TIMING_MIN_ROUNDS = 3
TIMING_BATCH_SIZES = (1, 32)
#: cold starts measured in a fresh process: none | reference | all
COLD_STARTS = ("none", "reference", "all")
COLD_START = "all"

#: every width the quant family builds (a sweep's ladder, the sensitivity table)
QUANT_BITS = (2, 3, 4, 6, 8)
#: the quant family's quantizers: round-to-nearest, AWQ, GPTQ, distilled scales (DWQ)
QUANT_METHODS = ("rtn", "awq", "gptq", "dwq")
#: the quant family's weights per group
GROUP_SIZE = 64
#: a search's candidate widths per layer (module docstring: why not QUANT_BITS)
SEARCH_BITS = (4, 6, 8)
#: calibration rows the per-layer sensitivity is measured on (``variants sensitivity
#: --n-examples``, ``variants search --n-sensitivity``)
N_SENSITIVITY = 200

#: tokens per text (special tokens included) when neither ``--max-length`` nor the model
#: TOML's ``max_length`` is given: None = what the checkpoint's tokenizer files say
#: (:func:`variants.checkpoints.files.decide_tokenizer`)
MAX_LENGTH = None
