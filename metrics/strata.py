"""Strata: the named subsets of examples a contract clause can restrict a metric to.

Fixed strata are ``STRATA``; a task stratum is ``task:<task name>`` (e.g.
``task:sentiment-3``), an option-count stratum ``options:<K>``, a reference-margin bin
``margin:<lo>-<hi>`` (raw logits, lo <= margin < hi, hi may be ``inf``).

``numerical_tie``: rows whose reference margin lies within ``NUMERICAL_TIE_MULTIPLE`` times the
reference's own numerical noise (:func:`metrics.evaluate.evaluate`, ``numerical_noise``): no
machine-independent answer; ``decided``: every other row (what the packaged contracts' flip
clauses count).
"""

import re

import numpy as np

from metrics._checks import short_repr

STRATA = ("all", "near_tie", "certified", "uncertified", "human_near_tie", "not_near_tie",
          "certified_conformal", "epsilon_held", "labeled", "numerical_tie", "decided")
TASK_STRATUM_PREFIX = "task:"
OPTIONS_STRATUM_PREFIX = "options:"
MARGIN_STRATUM_PREFIX = "margin:"
_NUMBER = r"\d+(?:\.\d*)?(?:e[+-]?\d+)?"  # as Python's :g writes it (1e-05, 2.5e+03)
_MARGIN_RE = re.compile(rf"^margin:({_NUMBER})-({_NUMBER}|inf)$")
_OPTIONS_RE = re.compile(r"^options:(\d+)$")


def check_stratum(stratum):
    """Raise ValueError unless ``stratum`` is one of ``STRATA`` or ``task:<name>``,
    ``options:<K>``, ``margin:<lo>-<hi>`` with lo < hi."""
    if not isinstance(stratum, str):
        raise ValueError(f"stratum must be a string, got {short_repr(stratum)}.")
    if stratum in STRATA:
        return
    if stratum.startswith(TASK_STRATUM_PREFIX) and len(stratum) > len(TASK_STRATUM_PREFIX):
        return
    if _OPTIONS_RE.match(stratum):
        return
    m = _MARGIN_RE.match(stratum)
    if m and float(m.group(1)) < float(m.group(2)):
        return
    raise ValueError(
        f"unknown stratum {short_repr(stratum)}; use one of {', '.join(STRATA)} or "
        f"'{TASK_STRATUM_PREFIX}<task name>', '{OPTIONS_STRATUM_PREFIX}<K>', "
        f"'{MARGIN_STRATUM_PREFIX}<lo>-<hi>' (e.g. margin:0-0.5, margin:2-inf)."
    )


def stratum_rows(ev, stratum):
    """Bool mask of shape (N,) of the examples of ``ev`` (an :class:`metrics.evaluation.
    Evaluation`) in ``stratum``.

    Raises
    ------
    ValueError
        If ``stratum`` is unknown (:func:`check_stratum`).
    """
    check_stratum(stratum)
    df = ev.per_example
    n = len(df)
    if stratum == "all":
        return np.ones(n, dtype=bool)
    if stratum == "near_tie":
        return df["near_tie"].to_numpy(dtype=bool)
    if stratum == "not_near_tie":
        return ~df["near_tie"].to_numpy(dtype=bool)
    if stratum == "certified":
        return df["certified"].to_numpy(dtype=bool)
    if stratum == "uncertified":
        return ~df["certified"].to_numpy(dtype=bool)
    if stratum == "labeled":
        return df["label"].to_numpy() >= 0
    if stratum == "decided":  # every row but the numerical ties (metrics.evaluate)
        return ev._array("numerical_tie") != 1.0
    if stratum in ("human_near_tie", "certified_conformal", "numerical_tie"):
        return ev._array(stratum) == 1.0
    if stratum == "epsilon_held":
        return ev._array("epsilon_exceeded") == 0.0
    if stratum.startswith(OPTIONS_STRATUM_PREFIX):
        return df["n_options"].to_numpy() == int(stratum[len(OPTIONS_STRATUM_PREFIX):])
    m = _MARGIN_RE.match(stratum)
    if m:
        margin = df["ref_margin"].to_numpy()
        return (margin >= float(m.group(1))) & (margin < float(m.group(2)))
    return (df["task"] == stratum[len(TASK_STRATUM_PREFIX):]).to_numpy()
