"""The table of attack cases: one entry per kind of bad input, fault or race (see harness.Case)."""
from __future__ import annotations

from cases_numbers import number_cases


def all_cases() -> list:
    out = number_cases()
    try:
        from cases_inputs import input_cases
        out += input_cases()
    except ImportError:
        pass
    try:
        from cases_files import file_cases
        out += file_cases()
    except ImportError:
        pass
    try:
        from cases_faults import fault_cases
        out += fault_cases()
    except ImportError:
        pass
    return out
