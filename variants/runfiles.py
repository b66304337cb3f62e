"""Moved to :mod:`runs.readers` (JSON/CSV) and :mod:`runs.npz_readers` (npz) (issue 15); this
shim keeps the old import path working."""

from runs.npz_readers import (OPTIONAL_OUTPUT_FIELDS, OUTPUT_FIELDS, check_outputs,  # noqa: F401
                              check_same_ids,
                              read_activation_stats, read_exit_heads, read_head_cache,
                              read_outputs)
from runs.readers import (FIX, SUMMARY_COLUMNS, TIMING_ENTRY_FIELDS, CorruptFileError,  # noqa: F401
                          read_build, read_json, read_metrics, read_run_json, read_summary,
                          read_timing, read_verdict)
