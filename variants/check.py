"""Moved to :mod:`runs` (issue 15): the judge to :mod:`runs.judge`, the commands to
:mod:`runs.commands.check`. This shim keeps the old import path working."""

from runs.commands import EXIT_OK, EXIT_USER_ERROR, EXIT_VIOLATION  # noqa: F401
from runs.commands.check import (_check_command, _non_negative, _selftest_command,  # noqa: F401
                                 build_parser, configure_check, configure_selftest, main)
from runs.family_text import family_extras  # noqa: F401
from runs.folder import CheckError  # noqa: F401
from runs.judge import (_json_safe, check_run, judge_outputs, judge_variant,  # noqa: F401
                        list_variants, load_outputs, read_run, require_family, variant_files)
from runs.plots.markdown import _plot_key, report_tail  # noqa: F401
from runs.settings import (DEFAULT_NEAR_TIE_MARGIN, check_calibration_size,  # noqa: F401
                           check_strata, resolve_settings)
from runs.texts import example_texts  # noqa: F401
