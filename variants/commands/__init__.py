"""One module per ``variants`` verb that lives on the model side (``sweep``, ``list``); the
entry point :mod:`variants.cli` imports a verb's module only when that verb runs. Imports no
MLX."""

import argparse

# EXIT_FAILURE (1): a violation (--fail-on-violation) or an output that could not be written
# (runs.io.WriteError, sweep.RunIncomplete); one place for the codes: contracts.exit_codes
from contracts.exit_codes import EXIT_OK, EXIT_USER_ERROR  # noqa: F401
from contracts.exit_codes import EXIT_VIOLATION as EXIT_FAILURE  # noqa: F401


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (the values of :mod:`variants.defaults`); the
    description and epilog keep their layout. A switch (``store_true`` / ``store_false``) shows
    none: "(default: True)" on ``--no-x`` reads as "off by default"."""

    def _get_help_string(self, action):
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return action.help
        return super()._get_help_string(action)
