"""Judging settings in force and the checks on them that need the outputs (no MLX).

Precedence: explicit arguments (``variants check --alpha``...), else the contract's
``[settings]``, else run.json (``near_tie_margin`` only), else the defaults. The reference's
numerical noise (``numerical_noise``, the numerical-tie stratum's scale) is a measurement of the
run, read from run.json's ``reference_noise`` (0 when absent: only exact ties).
"""

import math

import numpy as np

from metrics._checks import short_list, short_repr
from runs.folder import CheckError

#: Reference top-2 logit margin (raw-logit units) below which an example is a near tie, when
#: neither the contract, the command line nor run.json says otherwise.
from metrics.defaults import NEAR_TIE_MARGIN as DEFAULT_NEAR_TIE_MARGIN  # noqa: E402


def resolve_settings(contract, meta=None, *, near_tie_margin=None, alpha=None, n_bootstrap=None,
                     seed=None):
    """Settings in force: explicit arguments, else the contract's ``[settings]``, else run.json
    (``near_tie_margin``), else the defaults.

    Parameters
    ----------
    contract : contracts.checker.Contract
    meta : dict, optional
        run.json (``config.near_tie_margin`` is read).
    near_tie_margin, alpha, n_bootstrap, seed : optional
        Overrides (None = not given).

    Returns
    -------
    dict
        The contract's settings with the overrides applied.

    Raises
    ------
    CheckError
        If an override is not finite or out of its range (as the contract's ``[settings]``:
        :data:`contracts.contract.SETTINGS`), or a clause compares a bootstrap CI with its bound
        and ``n_bootstrap`` is 0.
    """
    check_overrides(near_tie_margin=near_tie_margin, alpha=alpha, n_bootstrap=n_bootstrap,
                    seed=seed)
    st = dict(contract.settings)
    if near_tie_margin is not None:
        st["near_tie_margin"] = float(near_tie_margin)
    elif st.get("near_tie_margin") is None:
        st["near_tie_margin"] = float((meta or {}).get("config", {}).get(
            "near_tie_margin", DEFAULT_NEAR_TIE_MARGIN))
    st["numerical_noise"] = numerical_noise(meta)  # run.json, else 0 (not measured)
    for key, value in (("alpha", alpha), ("n_bootstrap", n_bootstrap), ("seed", seed)):
        if value is not None:
            st[key] = value
    ci_clauses = [c.id for c in contract.clauses if c.compare == "ci"]
    if ci_clauses and not st["n_bootstrap"]:
        raise CheckError(f"clauses {short_list(ci_clauses)} compare a bootstrap CI with their bound, "
                         "so n_bootstrap must be > 0; drop --n-bootstrap 0 or those clauses' "
                         "compare = \"ci\"")
    return st


def numerical_noise(meta, where="run.json"):
    """The reference's numerical noise (raw-logit units) in run.json's
    ``reference_noise.max_abs_logit_diff``; 0.0 when the run predates it (not measured: only
    exact ties are numerical ties).

    Raises
    ------
    CheckError
        One line naming ``where`` and the key, when the value is not a finite number >= 0 (a
        bool, a string, a list, NaN, a negative number) or ``reference_noise`` is not a table.
    """
    rec = (meta or {}).get("reference_noise")
    if rec is None:
        return 0.0
    value = rec.get("max_abs_logit_diff") if isinstance(rec, dict) else rec
    ok = (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_)) and math.isfinite(value) and value >= 0)
    if not isinstance(rec, dict) or not ok:
        raise CheckError(f"{where}: reference_noise.max_abs_logit_diff is {short_repr(value)}, "
                         "not a finite number >= 0 (logit units); rerun the sweep to measure it "
                         "again, or delete reference_noise to judge without numerical ties")
    return float(value)


def check_overrides(**overrides):
    """Raise CheckError, naming the flag (``--alpha``...), for an override (None = not given)
    that the contract's ``[settings]`` would refuse: a wrong type, NaN, ±inf, out of range."""
    from contracts.contract import _SETTING_RANGES, SETTINGS

    for key, value in overrides.items():
        if value is None:
            continue
        types, _ = SETTINGS[key]
        ok, rule = _SETTING_RANGES[key]
        flag = "--" + key.replace("_", "-")
        numeric = (int, np.integer) if types == (int,) else (int, float, np.integer, np.floating)
        if isinstance(value, bool) or not isinstance(value, numeric):
            raise CheckError(f"{flag} {short_repr(value)} must be "
                             f"{'an integer' if types == (int,) else 'a number'} {rule}")
        if not (math.isfinite(value) and ok(value)):
            raise CheckError(f"{flag} {short_repr(value)} must be {rule}")


def check_calibration_size(n_calibration, alpha):
    """Raise CheckError when ``n_calibration`` examples cannot give a finite split-conformal ε
    (it needs ⌈1/α⌉ − 1 of them; Angelopoulos & Bates 2021, §1)."""
    need = math.ceil(1.0 / alpha) - 1
    if n_calibration < need:
        raise CheckError(
            f"alpha={alpha} needs at least {need if need < 1e12 else f'{float(need):.3g}'} "
            "calibration examples for the split-conformal ε, "
            f"got {n_calibration}: raise --n-calibration or alpha (contract [settings] or --alpha)")


def check_strata(contract, ref_eval):
    """A task:/options: stratum naming something absent from the outputs is a contract error.

    ``ref_eval`` is a mapping with ``task`` (N,) str and ``option_mask`` (N, K) bool. Raises
    CheckError naming the clause, its stratum and what the outputs have."""
    tasks = set(np.asarray(ref_eval["task"]).astype(str).tolist())
    counts = set(np.asarray(ref_eval["option_mask"]).sum(axis=1).astype(int).tolist())
    for c in contract.clauses:
        if c.stratum.startswith("task:") and c.stratum[5:] not in tasks:
            raise CheckError(f"clause {short_repr(c.id)}: stratum {short_repr(c.stratum)} "
                             f"matches no example; the outputs have tasks: "
                             f"{', '.join(sorted(tasks))}")
        if c.stratum.startswith("options:") and int(c.stratum[8:]) not in counts:
            raise CheckError(f"clause {short_repr(c.id)}: stratum {short_repr(c.stratum)} "
                             f"matches no example; the outputs have option counts: "
                             f"{', '.join(map(str, sorted(counts)))}")
