"""``variants compare``: two variants (of two runs, or of one run) on the same eval rows, with
paired statistics (no MLX).

- exact McNemar tests (the two-sided binomial test on the discordant pairs,
  :func:`scipy.stats.binomtest`; McNemar 1947, the exact form of Fay 2010) on which rows each
  side gets right and on which rows each flips against its run's reference;
- a paired bootstrap (the same resampled eval rows for both sides; Efron & Tibshirani 1993,
  Ch. 13) percentile CI of B − A for every clause of the contract, on the clause's own metric,
  stratum and statistic;
- the speed ratio of the two sides from each run's timing.json.

A multi-label or regression pair (run.json's ``model.outputs``) shows each side's head figures
(:mod:`metrics.head_summary`) side by side instead of the top-option tests; for multi-label the
exact McNemar test is on the rows whose set of labels changed against the reference, for
regression there is none (a line says why). A McNemar test on no labelled row is not reported.
Two sides whose models output different kinds are refused in one line naming both.

Two sides of different models (name or checkpoint), contracts (clauses, thresholds and
settings) or data (source, eval rows, eval fingerprint) are refused with one line
(:class:`CompareError`), the first differing eval row id named.
"""

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runs.html.data import clean, contract_digest


class CompareError(ValueError):
    """Two sides that cannot be compared, or a side that does not name a variant."""


@dataclass
class Side:
    """One side of a comparison: a run (``runs.plots.data.Run``) and one of its variants."""

    label: str
    run: object
    variant: str

    @property
    def meta(self):
        return self.run.meta

    @property
    def verdict(self):
        return self.run.folder.json(self.variant, "verdict.json")

    @property
    def evaluation(self):
        return self.run.evaluation(self.variant)


def side(spec, label):
    """Parse ``RUN`` or ``RUN:VARIANT`` (a sweep folder, and a variant in it) into a list of
    :class:`Side` (every variant of ``RUN`` without ``:VARIANT``).

    Raises
    ------
    CompareError
        Not a sweep folder, or no such variant (the message lists the run's variants).
    """
    from runs.plots.data import PlotError, load_run

    path, variant = str(spec), None
    if not Path(path).is_dir() and ":" in path:
        path, variant = path.rsplit(":", 1)
    try:
        run = load_run(path)
    except PlotError as e:
        raise CompareError(str(e)) from None
    if variant is not None and variant not in run.variants:
        raise CompareError(f"{label}: no variant {variant!r} in {path}; it has: "
                           f"{', '.join(run.variants)} (pass RUN:VARIANT).")
    return [Side(label, run, v) for v in ([variant] if variant else run.variants)]


def _names_a_variant(spec):
    return not Path(str(spec)).is_dir() and ":" in str(spec)


def pairs(spec_a, spec_b, log=None):
    """The (A, B) pairs to compare.

    Two RUN:VARIANT: those two. One RUN:VARIANT and a RUN of one variant: those two. Two RUNs:
    the variants they share by name; two runs of one variant each, of different names, are
    compared with each other, and ``log`` (callable(str), optional) is told so in one line.

    Raises
    ------
    CompareError
        Two runs that share no variant name (each side's listed), or one side naming a variant
        while the other is a run of several.
    """
    a, b = side(spec_a, "A"), side(spec_b, "B")
    named = (_names_a_variant(spec_a), _names_a_variant(spec_b))
    note = None
    if named[0] != named[1]:
        run, runs = ("B", b) if named[0] else ("A", a)
        if len(runs) != 1:
            raise CompareError(f"{'A' if run == 'B' else 'B'} names one variant but {run} is a run "
                               f"of {len(runs)} ({', '.join(s.variant for s in runs)}); name "
                               f"one variant on both sides (RUN:VARIANT) or none (every "
                               "variant the two runs share)")
    if named[0] or named[1]:
        out = [(a[0], b[0])]
    else:
        names_b = {s.variant: s for s in b}
        out = [(s, names_b[s.variant]) for s in a if s.variant in names_b]
        if not out and len(a) == 1 and len(b) == 1:
            out = [(a[0], b[0])]
        elif not out:
            raise CompareError(f"the runs have no variant in common (A: "
                               f"{', '.join(s.variant for s in a)}; B: {', '.join(names_b)}); "
                               "name the two to compare as RUN:VARIANT")
    if not all(named) and len(out) == 1 and out[0][0].variant != out[0][1].variant:
        note = (f"comparing B's {out[0][1].variant} with A's {out[0][0].variant}: two variants "
                "of different names")
    if note and log is not None:
        log(note)
    return out


def outputs_of(s):
    """What side ``s``'s model outputs (``softmax``, ``multi_label`` or ``regression``: run.json's
    ``model.outputs``, :func:`metrics.head_view.run_outputs`)."""
    from metrics.head_view import run_outputs

    return run_outputs(s.meta)


def check_comparable(a, b):
    """Refuse (CompareError, one line) two sides whose models output different kinds (a
    softmax against per-label sigmoids or a regression value: no figure measures both), of
    different models, contracts or data, or whose eval rows differ (naming the first differing
    row id)."""
    oa, ob = outputs_of(a), outputs_of(b)
    if oa != ob:
        raise CompareError(f"different outputs: A's model outputs {oa}, B's {ob}; the two "
                           "heads are not judged on the same figures, compare runs of heads "
                           "with the same outputs")
    ma, mb = a.meta, b.meta
    model = [(m.get("config", {}).get("model"), m.get("checkpoint", {}).get("sha256"))
             for m in (ma, mb)]
    if model[0] != model[1]:
        raise CompareError(f"different models: A is {model[0][0]} (checkpoint "
                           f"{str(model[0][1])[:12]}), B is {model[1][0]} (checkpoint "
                           f"{str(model[1][1])[:12]}); compare runs of one model")
    va, vb = a.verdict, b.verdict
    for s, v in ((a, va), (b, vb)):
        if not v.get("clauses"):
            raise CompareError(f"{s.label}: {s.variant} in {s.run.path} has no verdict.json "
                               f"(never judged); run `variants check {s.run.path}` first")
    da, db = contract_digest(va), contract_digest(vb)
    if da != db:
        raise CompareError(f"different contracts: A {va.get('contract')} ({da}), B "
                           f"{vb.get('contract')} ({db}); rerun `variants check --contract` "
                           "on one side")
    src = [m.get("data", {}).get("source") for m in (ma, mb)]
    if src[0] != src[1]:
        raise CompareError(f"different data: A {src[0]!r}, B {src[1]!r}")
    ia = a.run.outputs(a.variant)["ids"]
    ib = b.run.outputs(b.variant)["ids"]
    for i, (x, y) in enumerate(zip(ia, ib)):
        if x != y:
            raise CompareError(f"different eval rows: row {i} is {x} in A but {y} in B; compare "
                               "runs with the same --n-eval, --seed and data")
    if len(ia) != len(ib):
        longer, first = ("A", ia[len(ib)]) if len(ia) > len(ib) else ("B", ib[len(ia)])
        raise CompareError(f"different eval rows: A has {len(ia)}, B {len(ib)}; {longer}'s "
                           f"row {min(len(ia), len(ib))} ({first}) has no partner")
    fp = [m.get("data", {}).get("splits", {}).get("eval", {}).get("fingerprint")
          for m in (ma, mb)]
    la, lb = (s.run.outputs("reference")["labels"] for s in (a, b))
    if fp[0] != fp[1] or not np.array_equal(la, lb):
        raise CompareError(f"different data: the same eval row ids but eval fingerprints "
                           f"{fp[0]} and {fp[1]} (texts or labels differ)")


def mcnemar(x, y):
    """Exact McNemar test of paired bools ``x`` (A) and ``y`` (B), shape (N,).

    Returns
    -------
    dict
        ``n`` pairs, ``a_only`` (x true, y false), ``b_only``, ``both``, ``neither`` and the
        two-sided exact p-value: :func:`scipy.stats.binomtest` of ``b_only`` in the
        ``a_only + b_only`` discordant pairs at 1/2 (1.0 with no discordant pair).
    """
    from scipy.stats import binomtest

    x, y = np.asarray(x, bool), np.asarray(y, bool)
    a_only, b_only = int((x & ~y).sum()), int((~x & y).sum())
    d = a_only + b_only
    p = binomtest(b_only, d, 0.5).pvalue if d else 1.0
    return {"n": int(x.size), "a_only": a_only, "b_only": b_only, "both": int((x & y).sum()),
            "neither": int((~x & ~y).sum()), "p_value": float(p)}


def _statistic(ev, metric, stratum, statistic, idx):
    """(B,) ``statistic`` of ``metric`` on ``stratum`` within each resample ``idx`` (B, N) of
    the eval rows; NaN where the resample holds no defined value."""
    from metrics.registry import SET, spec
    from metrics.statistics import column_statistic, column_statistic_rows

    rows = ev.rows(stratum)
    s = spec(metric)
    out = np.full(idx.shape[0], np.nan)
    if s.kind == SET and rows.all():
        if idx.shape[1] == 0:  # no row left: only the run's constants (nonfinite_rows) count
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "Mean of empty slice"
                return np.asarray(s.compute(ev, idx), dtype=np.float64)
        return np.asarray(s.compute(ev, idx), dtype=np.float64)
    if idx.shape[1] == 0:  # no row left (every row NaN or inf on one side): nothing to resample
        return out
    values = None if s.kind == SET else ev._array(metric)
    if values is not None and rows.all() and np.isfinite(values).all():
        return np.asarray(column_statistic_rows(values[idx], statistic), dtype=np.float64)
    for k, r in enumerate(idx):
        r = r[rows[r]]
        if s.kind == SET:
            if r.size:
                out[k] = float(np.asarray(s.compute(ev, r[None, :]))[0])
            continue
        v = values[r]
        v = v[~np.isnan(v)]
        if v.size:
            out[k] = column_statistic(v, statistic)
    return out


def paired_evaluations(a, b):
    """``(ea, eb, n_dropped)``: the two sides' evaluations on the same rows. A row either side
    answered with NaN or inf (:mod:`metrics.finite`) is left out of both (``n_dropped`` such
    rows); each side's ``finite-outputs`` count stays its own."""
    from metrics.finite import nonfinite_rows

    drop = nonfinite_rows(a.run.outputs(a.variant)) | nonfinite_rows(b.run.outputs(b.variant))
    if not drop.any():
        return a.evaluation, b.evaluation, 0
    return (a.run.evaluation(a.variant, drop=drop), b.run.evaluation(b.variant, drop=drop),
            int(drop.sum()))


def clause_differences(a, b, *, n_boot=1000, confidence=0.95, seed=0, evaluations=None):
    """Per clause of A's verdict: A's value, B's value, B − A and its paired bootstrap CI, and
    which side the clause's direction favours. Rows are resampled together (one index array
    for both sides); ``evaluations`` (ea, eb) default :func:`paired_evaluations`'."""
    from metrics.bootstrap import bootstrap_indices

    ea, eb = evaluations or paired_evaluations(a, b)[:2]
    idx = bootstrap_indices(len(ea.per_example), n_boot=n_boot, seed=seed)
    lo_q, hi_q = 100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2
    rows = []
    for c in a.verdict["clauses"]:
        m, st, stat = c["metric"], c["stratum"], c["statistic"]
        va, vb = ea.value(m, st, stat), eb.value(m, st, stat)
        diff = _statistic(eb, m, st, stat, idx) - _statistic(ea, m, st, stat, idx)
        diff = diff[np.isfinite(diff)]
        lo, hi = (np.percentile(diff, [lo_q, hi_q]) if diff.size else (math.nan, math.nan))
        rows.append({"clause": c["id"], "metric": m, "stratum": st, "statistic": stat,
                     "op": c["op"], "threshold": c["threshold"], "a": va, "b": vb,
                     "difference": vb - va, "ci": [float(lo), float(hi)],
                     "higher_is_better": c["op"] == ">="})
    return rows


def speed(a, b):
    """Per timed batch size both sides share: each side's variant p50 (ms) and speed-up against
    its own reference, the p50 ratio A / B (> 1: B faster) with a 95% bootstrap CI (each side's
    rounds resampled on its own: the two were not timed in alternation with each other) and the
    ratio of the two speed-ups."""
    from metrics.bootstrap import bootstrap_indices

    ta, tb = (s.run.folder.json(s.variant, "timing.json").get("batches", {}) for s in (a, b))
    out = []
    for bs in sorted(set(ta) & set(tb), key=int):
        xa, xb = (np.asarray(t[bs].get("var_ms") or [], float) for t in (ta, tb))
        ci = [None, None]
        if xa.size >= 2 and xb.size >= 2:
            ra = np.median(xa[bootstrap_indices(xa.size, n_boot=2000, seed=1)], axis=1)
            rb = np.median(xb[bootstrap_indices(xb.size, n_boot=2000, seed=2)], axis=1)
            ci = np.percentile(ra / rb, [2.5, 97.5]).tolist()
        pa, pb = ta[bs]["var"]["p50_ms"], tb[bs]["var"]["p50_ms"]
        sa, sb = (t[bs]["speedup"]["speedup_median"] for t in (ta, tb))
        out.append({"batch_size": int(bs), "a_p50_ms": pa, "b_p50_ms": pb,
                    "p50_ratio_a_over_b": pa / pb, "ci": ci, "a_speedup": sa, "b_speedup": sb,
                    "speedup_ratio_b_over_a": sb / sa})
    return out


def worse(rows, margin, relative_margin=0.0):
    """Clauses on which B is worse than A beyond the allowed margin: the whole paired CI of
    B − A lies past it in the clause's bad direction. The allowed margin of a clause is the
    larger of ``margin`` (the clause metric's units) and ``relative_margin`` × |threshold|."""
    out = []
    for r in rows:
        lo, hi = r["ci"]
        m = max(margin, relative_margin * abs(r["threshold"] or 0.0))
        if r["higher_is_better"] and hi is not None and hi < -m:
            out.append(r["clause"])
        elif not r["higher_is_better"] and lo is not None and lo > m:
            out.append(r["clause"])
    return out


def _word(verdict):
    """'fail', 'undecided' (no clause failed, one or more undecided) or 'pass' of a verdict.json
    dict (files written before undecided clauses existed have no ``undecided`` list)."""
    if verdict.get("failed"):
        return "fail"
    return "undecided" if verdict.get("undecided") else "pass"


SOFTMAX = "softmax"

#: why a regression comparison has no McNemar test (said in its place)
NO_MCNEMAR_REGRESSION = ("no McNemar test: a regression head makes no yes/no decision per row "
                         "(its value is judged against the reference's, on the figures above)")


def head_tests(a, b, ea, eb, outputs):
    """The paired tests of a multi-label or regression pair (``ea``, ``eb`` the two sides'
    evaluations on the same rows): ``outputs``, ``head_figures`` ({"a", "b"}: each side's
    :func:`metrics.head_summary.head_summary`, keys in :data:`metrics.head_summary.KEYS` order,
    with the tolerance each side's verdict was judged under) and, for multi-label, the exact
    McNemar test (:func:`mcnemar`) on the rows whose set of labels decided yes (sigmoid >= 0.5)
    changed against each side's reference (``mcnemar_label_set``); for regression
    ``mcnemar_note`` (:data:`NO_MCNEMAR_REGRESSION`) in its place. ``mcnemar_correct`` and
    ``mcnemar_flips`` (the softmax's top-option tests) are None: they do not apply."""
    from metrics.head_summary import KEYS, head_summary

    figures = {}
    for key, s, ev in (("a", a, ea), ("b", b, eb)):
        tol = (s.verdict.get("settings") or {}).get("value_tolerance")
        got = head_summary(ev, outputs, tol)
        figures[key] = {k: got[k] for k in KEYS[outputs]}
    from metrics.head_view import not_applicable

    out = {"outputs": outputs, "head_figures": figures, "head_note": not_applicable(outputs),
           "mcnemar_correct": None, "mcnemar_flips": None}
    if outputs == "multi_label":
        out["mcnemar_label_set"] = mcnemar(ea.detail["label_flip"].to_numpy(bool),
                                           eb.detail["label_flip"].to_numpy(bool))
    else:
        out["mcnemar_note"] = NO_MCNEMAR_REGRESSION
    return out


def compare_pair(a, b, *, n_boot=1000, confidence=0.95, seed=0, margin=0.0,
                 relative_margin=0.0):
    """Everything ``variants compare`` reports about one (A, B) pair, as a JSON-ready dict.

    Raises
    ------
    CompareError
        As :func:`check_comparable`.
    """
    check_comparable(a, b)
    ea, eb, dropped = paired_evaluations(a, b)
    pa, pb = ea.per_example, eb.per_example
    known = pa["label"].to_numpy() >= 0
    rows = clause_differences(a, b, n_boot=n_boot, confidence=confidence, seed=seed,
                              evaluations=(ea, eb))
    outputs = outputs_of(a)
    if outputs == SOFTMAX:
        tests = {"mcnemar_correct": (mcnemar(pa.loc[known, "var_correct"].to_numpy(dtype=bool),
                                             pb.loc[known, "var_correct"].to_numpy(dtype=bool))
                                     if known.any() else None),
                 "mcnemar_flips": mcnemar(pa["flip"].to_numpy(bool), pb["flip"].to_numpy(bool))}
    else:
        tests = head_tests(a, b, ea, eb, outputs)
    return clean({
        "a": {"run": str(a.run.path), "variant": a.variant, "seed": a.meta["config"].get("seed")},
        "b": {"run": str(b.run.path), "variant": b.variant, "seed": b.meta["config"].get("seed")},
        "n_rows": int(len(pa)), "n_labelled": int(known.sum()),
        "n_nonfinite_dropped": dropped,
        "same_reference": bool(np.array_equal(a.run.outputs("reference")["logits"],
                                              b.run.outputs("reference")["logits"])),
        "contract": {"name": a.verdict.get("contract"), "digest": contract_digest(a.verdict)},
        **tests,
        "clauses": rows, "speed": speed(a, b),
        "bootstrap": {"n_boot": n_boot, "confidence": confidence, "seed": seed,
                      "method": "paired percentile bootstrap over eval rows"},
        "margin": margin, "relative_margin": relative_margin,
        "worse": worse(rows, margin, relative_margin),
        "verdicts": {"a": _word(a.verdict), "b": _word(b.verdict)},
    })
