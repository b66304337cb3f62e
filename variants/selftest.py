"""Moved to :mod:`runs.selftest` (issue 15); this shim keeps the old import path working."""

from runs.selftest import (FAULTS, Fault, infer_action_map, refinish, run_selftest,  # noqa: F401
                           synthetic_outputs)
