"""Moved to :mod:`runs.outputs` (issue 15); this shim keeps the old import path working."""

from runs.outputs import OPTIONAL_FIELDS, DecisionOutputs, finish_outputs  # noqa: F401
