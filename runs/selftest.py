"""Planted faults: perturb reference outputs in known ways and show the contract catches each.

Each fault turns the reference's saved outputs (calibration and eval splits) into a fake
"variant" whose defect is known, re-deriving probabilities, expected scores, confidence and
action probabilities with :func:`runs.outputs.finish_outputs` where the fault changes their
inputs. The checker must fail the clause meant to catch the fault, and pass every clause on the
unperturbed copy. Used by ``variants selftest`` and ``tests/contracts/test_checker.py``; no mlx.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from runs.judge import judge_outputs
from runs.outputs import finish_outputs
from runs.settings import resolve_settings


@dataclass(frozen=True)
class Fault:
    """A known perturbation and the clause of the default contract meant to catch it.

    ``apply(cal, eval, rng) -> (cal, eval)`` takes and returns dicts of output arrays.
    """

    description: str
    clause: str
    apply: Callable


def _copy(out):
    return {k: np.array(v, copy=True) for k, v in out.items()}


def infer_action_map(out):
    """Option -> action map of shape (N, K, A) behind saved outputs, solved per (task, K).

    ``action_probs = probs @ M`` for each task's map M (K, A); least squares over the task's
    examples recovers M (rounded to 0/1 when within 1e-3 of it).

    Raises
    ------
    ValueError
        If a group's action probabilities are not a linear map of its option probabilities.
    """
    probs = np.asarray(out["probs"], dtype=np.float64)
    actions = np.asarray(out["action_probs"], dtype=np.float64)
    mask = out["option_mask"]
    n, k = probs.shape
    result = np.zeros((n, k, actions.shape[1]))
    keys = [f"{t}|{m}" for t, m in zip(out["task"], mask.sum(axis=1))]
    for key in dict.fromkeys(keys):
        rows = np.array([x == key for x in keys])
        valid = mask[rows][0]
        p = probs[rows][:, valid]
        m, *_ = np.linalg.lstsq(p, actions[rows], rcond=None)
        if np.abs(p @ m - actions[rows]).max() > 1e-4:
            raise ValueError(f"action probabilities of group {key} are not a map of the option "
                             "probabilities; cannot re-derive them after a perturbation.")
        rounded = np.round(m)
        m = np.where(np.abs(m - rounded) < 1e-3, rounded, m)
        full = np.zeros((k, actions.shape[1]))
        full[valid] = m
        result[rows] = full
    return result


def refinish(out, *, logits=None, option_mask=None, temperature=None, option_scores=None,
             action_map=None):
    """Re-derive every output of ``out`` after replacing some of its inputs."""
    amap = infer_action_map(out) if action_map is None else action_map
    mask = out["option_mask"] if option_mask is None else option_mask
    amap = np.where(mask[:, :, None], amap, 0.0)
    d = finish_outputs(out["logits"] if logits is None else logits, mask,
                       out["temperature"] if temperature is None else temperature,
                       out["option_scores"] if option_scores is None else option_scores, amap,
                       ids=out["ids"], task=out["task"], labels=out["labels"],
                       human_dist=out["human_dist"])
    return {k: getattr(d, k) for k in out}


def _swap_top2(cal, ev, rng, share=0.01):
    """Eval only: on 1% of examples with a non-zero margin, swap the two largest logits."""
    ev = _copy(ev)
    z = np.where(ev["option_mask"], ev["logits"], -np.inf)
    order = np.argsort(-z, axis=1)
    rows_ok = np.flatnonzero((ev["option_mask"].sum(axis=1) > 1)
                             & (z[np.arange(len(z)), order[:, 0]] > z[np.arange(len(z)), order[:, 1]]))
    rows = rng.choice(rows_ok, max(1, int(round(share * len(z)))), replace=False)
    a, b = order[rows, 0], order[rows, 1]
    logits = ev["logits"].copy()
    logits[rows, a], logits[rows, b] = ev["logits"][rows, b], ev["logits"][rows, a]
    return cal, refinish(ev, logits=logits)


def _scale(cal, ev, rng, factor=1.05):
    return tuple(refinish(o, logits=o["logits"] * factor) for o in (cal, ev))


def _noise(cal, ev, rng, size=0.5):
    """Gaussian noise with standard deviation ``size × T`` (0.5 in temperature-scaled units)."""
    return tuple(refinish(o, logits=o["logits"] + rng.normal(size=o["logits"].shape)
                          * size * o["temperature"][:, None]) for o in (cal, ev))


def _wrong_temperature(cal, ev, rng):
    """Each example gets the temperature of another option-count bucket (2T when only one)."""
    temps = {int(k): float(t) for k, t in zip(ev["option_mask"].sum(axis=1), ev["temperature"])}
    keys = sorted(temps)

    def wrong(o):
        k = o["option_mask"].sum(axis=1)
        if len(keys) == 1:
            return o["temperature"] * 2.0
        nxt = {a: temps[keys[(i + 1) % len(keys)]] for i, a in enumerate(keys)}
        return np.array([nxt.get(int(kk), 2.0 * t) for kk, t in zip(k, o["temperature"])])

    return tuple(refinish(o, temperature=wrong(o)) for o in (cal, ev))


def _drop_option(cal, ev, rng, share=0.01):
    """Eval only: on 1% of examples with >= 2 options, drop the last valid option."""
    mask = ev["option_mask"].copy()
    ok = np.flatnonzero(mask.sum(axis=1) >= 2)
    rows = rng.choice(ok, max(1, int(round(share * len(mask)))), replace=False)
    last = mask.sum(axis=1)[rows] - 1
    mask[rows, last] = False
    logits = np.where(mask, ev["logits"], 0.0)
    return cal, refinish(ev, logits=logits, option_mask=mask)


def _permute_actions(cal, ev, rng):
    """Roll the action axis of the option -> action map by one (escalate <-> review <-> none)."""
    out = []
    for o in (cal, ev):
        o = _copy(o)
        o["action_probs"] = np.roll(o["action_probs"], 1, axis=1)
        out.append(o)
    return tuple(out)


def _shift_scores(cal, ev, rng, shift=0.2):
    """Every option score + 0.2 (expected scores shift by 0.2; tasks without scores unchanged)."""
    return tuple(refinish(o, option_scores=o["option_scores"] + shift) for o in (cal, ev))


#: Fault name -> what it does and the clause of the default contract meant to catch it.
FAULTS = {
    "swap-top2-1pct": Fault("swap the top-2 logits on 1% of eval examples", "certified-flips",
                            _swap_top2),
    "scale-logits-1.05": Fault("scale all logits by 1.05", "temperature-refit", _scale),
    "logit-noise": Fault("add N(0, (T/2)^2) noise to every logit", "kl-p95", _noise),
    "wrong-temperature": Fault("use another option-count bucket's temperature (2T if one bucket)",
                               "bound-violations", _wrong_temperature),
    "drop-option": Fault("drop the last option from the mask on 1% of eval examples",
                         "option-mask", _drop_option),
    "permute-actions": Fault("permute the option -> action map", "action-drift-p95",
                             _permute_actions),
    "shift-scores": Fault("shift every option score by +0.2", "score-error-max", _shift_scores),
}


def synthetic_outputs(n=800, *, seed=0):
    """Calibrated reference outputs without a model: (calibration, eval) dicts of arrays.

    Tasks: ``choice-2`` (K=2, T=0.1), ``sentiment-3`` (K=3, T=1.6, scores -1/0/1), ``choice-4``
    (K=4, T=0.5) and ``choice-5`` (K=5, T=0.25); labels drawn from the model's own probabilities
    (so it is calibrated), 10% unknown; 9 raters per item; option k -> action k mod 3.
    """
    rng = np.random.default_rng(seed)
    buckets = [("choice-2", 2, 0.1), ("sentiment-3", 3, 1.6), ("choice-4", 4, 0.5),
               ("choice-5", 5, 0.25)]
    k_max = 5

    def split(name, n):
        which = rng.integers(0, len(buckets), size=n)
        task = np.array([buckets[w][0] for w in which])
        k = np.array([buckets[w][1] for w in which])
        t = np.array([buckets[w][2] for w in which])
        mask = np.arange(k_max)[None, :] < k[:, None]
        logits = np.where(mask, rng.normal(scale=2.0, size=(n, k_max)) * t[:, None], 0.0)
        z = np.where(mask, logits / t[:, None], -np.inf)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        labels = np.array([rng.choice(k_max, p=row) for row in p])
        labels[rng.random(n) < 0.1] = -1
        raters = np.array([rng.multinomial(9, row) / 9 for row in p])
        human = np.where(mask, raters, np.nan)
        scores = np.where(task[:, None] == "sentiment-3", np.array([-1.0, 0.0, 1.0, np.nan, np.nan]),
                          np.nan)
        amap = np.zeros((n, k_max, 3))
        for kk in range(k_max):
            amap[:, kk, kk % 3] = mask[:, kk]
        d = finish_outputs(logits, mask, t, scores, amap, ids=[f"{name}{i}" for i in range(n)],
                           task=task, labels=labels, human_dist=human)
        return {f: getattr(d, f) for f in ("ids", "task", "logits", "option_mask", "temperature",
                                           "probs", "option_scores", "expected_score",
                                           "confidence", "action_probs", "labels", "human_dist")}

    return split("cal", n), split("eval", n)


def run_selftest(run_dir=None, *, contract=None, seed=0, faults=None):
    """Check the clean copy and every planted fault; one row per case.

    Parameters
    ----------
    run_dir : path-like, optional
        Run folder whose ``reference/`` outputs are perturbed; None = :func:`synthetic_outputs`.
    contract : contracts.checker.Contract, optional
        Default: the packaged default contract.
    seed : int, default=0
    faults : iterable of str, optional
        Names of ``FAULTS`` to plant (default: all).

    Returns
    -------
    pandas.DataFrame
        Columns ``case``, ``description``, ``expected`` (clause meant to catch it; "—" for the
        clean copy), ``failed`` (clauses that failed, ";"-joined), ``caught`` (bool: the expected
        clause failed; for the clean copy, nothing failed).
    """
    from contracts.checker import load_contract

    contract = load_contract(None) if contract is None else contract
    if run_dir is None:
        ref_cal, ref_eval = synthetic_outputs(seed=seed)
        meta = {}
    else:
        from runs.folder import REFERENCE, RunFolder
        from runs.npz_readers import OUTPUT_FIELDS

        run = RunFolder(run_dir)
        ref_cal, ref_eval = ({k: run.outputs(REFERENCE, s)[k] for k in OUTPUT_FIELDS}
                             for s in ("calibration", "eval"))
        meta = run.meta
    settings = resolve_settings(contract, meta, n_bootstrap=200)
    cases = [("clean", "unperturbed copy of the reference", "—", lambda c, e, r: (_copy(c), _copy(e)))]
    for name, f in FAULTS.items():
        if faults is None or name in faults:
            cases.append((name, f.description, f.clause, f.apply))
    rows = []
    for i, (name, description, clause, apply) in enumerate(cases):
        rng = np.random.default_rng([seed, i])
        var_cal, var_eval = apply(ref_cal, ref_eval, rng)
        _, verdict, _ = judge_outputs(ref_cal, ref_eval, var_cal, var_eval, contract,
                                      settings=settings)
        failed = verdict.failed
        caught = (not failed and not verdict.untested) if name == "clean" else clause in failed
        rows.append({"case": name, "description": description, "expected": clause,
                     "failed": ";".join(failed) or "none", "caught": bool(caught)})
    return pd.DataFrame(rows)
