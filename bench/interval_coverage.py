"""Coverage and width of every interval method the checker uses, by exact enumeration (rates and
paired differences) and a seeded Monte Carlo (the percentile bootstrap).

Usage: .venv/bin/python bench/interval_coverage.py [--confidence 0.95 --threshold 0.01
--bootstrap-reps 1000 --n-boot 1000 --seed 0]

- Clopper–Pearson (a rate): k ~ Binomial(n, p), summed exactly over k (tails below 1e-12).
- The accuracy drop (b - c)/n: (b, c, rest) ~ Trinomial(n; p10, p01, 1 - p10 - p01), summed
  exactly over (b, c), for Tango's score interval (the checker's), Newcombe's hybrid score
  interval (method 10; it also needs the rows both get right: the reference's accuracy is set to
  ``--reference-accuracy``, a ~ Binomial(n - b - c, ·) summed too) and the Bonferroni pair of
  Clopper–Pearson intervals (the checker's before issue #38). ``P(hi<=t)`` is the probability
  that the upper end is at most ``--threshold``: for equal rates (true drop 0) the pass rate of a
  variant with no drop under "accuracy drop <= t, compare ci"; for a true drop above t the
  false-pass rate. ``E[b+c]`` is the expected discordant count: where it is below ~5 every
  interval covers 0 at b = c = 0 and coverage is ~1 whatever the method.
- The percentile bootstrap (a mean and a p95 of a lognormal(0, 1) per-row value, skewed as a
  per-row KL is): ``--bootstrap-reps`` samples of n rows, each given the checker's interval
  (:func:`metrics.bootstrap.bootstrap_ci`, ``--n-boot`` resamples, seed 0, as ``variants
  check``); coverage is a Monte-Carlo estimate (± its standard error shown). About a minute of
  CPU with the defaults.

The enumerated rows are exact and the same on every CPU; the bootstrap rows depend only on
``--seed``. The table in docs/contracts.md ("How good the intervals are") is this script's output
with the defaults.
"""

import argparse
import math
import time

import numpy as np
from scipy.special import gammaln
from scipy.stats import binom

from metrics.bootstrap import bootstrap_ci
from metrics.intervals import clopper_pearson
from metrics.paired import clopper_pearson_difference, newcombe_paired_interval, tango_intervals
from metrics.statistics import column_statistic_rows

SIZES = (50, 200, 800, 5000)
RATES = (0.001, 0.01, 0.05, 0.2, 0.5)
DISCORDANT = ((0.002, 0.002), (0.005, 0.005), (0.01, 0.005), (0.02, 0.02), (0.05, 0.03))
BOOTSTRAP_SIZES = (50, 200, 800)
PAIRED_METHODS = ("tango", "newcombe", "cp-bonferroni")
_TAIL = 1e-12


def _span(n, p):
    """Counts of Binomial(n, p) outside which each tail holds below ``_TAIL``."""
    return np.arange(int(binom.ppf(_TAIL, n, p)), int(binom.isf(_TAIL, n, p)) + 1)


def rate_coverage(n, p, *, confidence=0.95):
    """Exact coverage and mean width of the Clopper–Pearson interval of k ~ Binomial(n, p):
    ``{"coverage", "width", "mass"}`` (mass = probability enumerated, ~1)."""
    k = _span(n, p)
    prob = binom.pmf(k, n, p)
    ends = np.array([clopper_pearson(int(x), n, confidence=confidence) for x in k])
    covers = (ends[:, 0] <= p) & (p <= ends[:, 1])
    return {"coverage": float(prob @ covers), "width": float(prob @ (ends[:, 1] - ends[:, 0])),
            "mass": float(prob.sum())}


def paired_tables(n, p10, p01):
    """(b, c, probability) of the (b, c) cells of Trinomial(n; p10, p01, rest) worth counting:
    1-D arrays over the pairs with probability above 1e-15."""
    bs, cs = np.meshgrid(_span(n, p10), _span(n, p01), indexing="ij")
    b, c = bs.ravel(), cs.ravel()
    ok = b + c <= n
    b, c = b[ok], c[ok]
    logp = (gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(n - b - c + 1)
            + b * math.log(p10) + c * math.log(p01) + (n - b - c) * math.log1p(-p10 - p01))
    prob = np.exp(logp)
    keep = prob > 1e-15
    return b[keep], c[keep], prob[keep]


def paired_intervals(method, b, c, n, *, confidence=0.95):
    """(low, high) arrays of ``method`` (one of :data:`PAIRED_METHODS` but Newcombe) for the
    tables (b, c) of n rows."""
    if method == "tango":
        return tango_intervals(b, c, n, confidence=confidence)
    if method == "cp-bonferroni":
        ends = np.array([clopper_pearson_difference(int(x), int(y), n, confidence=confidence)
                         for x, y in zip(b, c)])
        return ends[:, 0], ends[:, 1]
    raise ValueError(f"method must be 'tango' or 'cp-bonferroni', got {method!r}.")


def _newcombe_moments(b, c, n, p10, p01, reference_accuracy, confidence, threshold, delta):
    """(coverage, mean width, P(high <= threshold)) of Newcombe's interval, the rows both get
    right a ~ Binomial(n - b - c, p11 / (1 - p10 - p01)) summed for each (b, c)."""
    q = (reference_accuracy - p10) / (1.0 - p10 - p01)
    m = n - b - c
    half = int(math.ceil(8 * math.sqrt(n * q * (1 - q)))) + 2
    offsets = np.arange(-half, half + 1)
    a = np.round(m * q).astype(np.int64)[:, None] + offsets[None, :]
    mm = np.broadcast_to(m[:, None], a.shape)
    inside = (a >= 0) & (a <= mm)
    pa = np.where(inside, binom.pmf(np.clip(a, 0, mm), mm, q), 0.0)
    low, high = newcombe_paired_interval(b[:, None], c[:, None], n, a=np.clip(a, 0, mm),
                                         confidence=confidence)  # (pairs, a values)
    covers = ((low <= delta) & (delta <= high)).astype(float)
    return ((pa * covers).sum(1), (pa * (high - low)).sum(1),
            (pa * (high <= threshold)).sum(1), pa.sum(1))


def paired_coverage(method, n, p10, p01, *, confidence=0.95, threshold=0.01,
                    reference_accuracy=0.9):
    """Exact coverage of the true drop ``p10 - p01``, mean width and ``P(high <= threshold)``
    of a paired-difference interval over Trinomial(n; p10, p01, rest):
    ``{"coverage", "width", "pass", "mass"}``."""
    b, c, prob = paired_tables(n, p10, p01)
    delta = p10 - p01
    if method == "newcombe":
        cov, width, passes, mass = _newcombe_moments(b, c, n, p10, p01, reference_accuracy,
                                                     confidence, threshold, delta)
        return {"coverage": float(prob @ cov), "width": float(prob @ width),
                "pass": float(prob @ passes), "mass": float(prob @ mass)}
    low, high = paired_intervals(method, b, c, n, confidence=confidence)
    covers = (low <= delta) & (delta <= high)
    return {"coverage": float(prob @ covers), "width": float(prob @ (high - low)),
            "pass": float(prob @ (high <= threshold)), "mass": float(prob.sum())}


def bootstrap_coverage(statistic, n, *, reps=1000, n_boot=1000, confidence=0.95, seed=0):
    """Monte-Carlo coverage and mean width of the checker's percentile-bootstrap interval of
    ``statistic`` ('mean' or 'p95') of n lognormal(0, 1) rows: ``{"coverage", "se", "width"}``
    over ``reps`` samples drawn with ``numpy.random.default_rng(seed)``."""
    from scipy.special import ndtri

    truth = math.exp(0.5) if statistic == "mean" else math.exp(float(ndtri(0.95)))
    rng = np.random.default_rng(seed)
    hits, widths = 0, []
    for _ in range(reps):
        values = rng.lognormal(0.0, 1.0, size=n)
        low, high = bootstrap_ci(lambda idx: column_statistic_rows(values[idx], statistic), n,
                                 n_boot=n_boot, confidence=confidence, seed=0, vectorized=True)
        hits += low <= truth <= high
        widths.append(high - low)
    cov = hits / reps
    return {"coverage": cov, "se": math.sqrt(cov * (1 - cov) / reps),
            "width": float(np.mean(widths))}


def table(*, confidence=0.95, threshold=0.01, reference_accuracy=0.9, bootstrap_reps=1000,
          n_boot=1000, seed=0, sizes=SIZES, rates=RATES, discordant=DISCORDANT,
          bootstrap_sizes=BOOTSTRAP_SIZES):
    """Rows (dicts: method, n, rates, E[b+c], coverage, width, P(hi<=t)) of the whole table."""
    rows = []
    for p in rates:
        for n in sizes:
            r = rate_coverage(n, p, confidence=confidence)
            rows.append({"method": "clopper-pearson", "n": n, "rates": f"p={p:g}",
                         "E[b+c]": "", "coverage": f"{r['coverage']:.4f}",
                         "width": f"{r['width']:.4f}", "P(hi<=t)": ""})
    for p10, p01 in discordant:
        for n in sizes:
            for method in PAIRED_METHODS:
                r = paired_coverage(method, n, p10, p01, confidence=confidence,
                                    threshold=threshold, reference_accuracy=reference_accuracy)
                rows.append({"method": method, "n": n, "rates": f"{p10:g}/{p01:g}",
                             "E[b+c]": f"{n * (p10 + p01):.1f}",
                             "coverage": f"{r['coverage']:.4f}", "width": f"{r['width']:.4f}",
                             "P(hi<=t)": f"{r['pass']:.3f}"})
    for statistic in ("mean", "p95"):
        for n in bootstrap_sizes:
            if not bootstrap_reps:
                continue
            r = bootstrap_coverage(statistic, n, reps=bootstrap_reps, n_boot=n_boot,
                                   confidence=confidence, seed=seed)
            rows.append({"method": "bootstrap-percentile", "n": n,
                         "rates": f"{statistic} of lognormal(0,1)", "E[b+c]": "",
                         "coverage": f"{r['coverage']:.3f} ± {r['se']:.3f}",
                         "width": f"{r['width']:.4f}", "P(hi<=t)": ""})
    return rows


def markdown(rows):
    """The rows as a Markdown table (the form pasted into docs/contracts.md)."""
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    out += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def configure_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--confidence", type=float, default=0.95, help="nominal level")
    p.add_argument("--threshold", type=float, default=0.01,
                   help="accuracy-drop threshold of the P(hi<=t) column")
    p.add_argument("--reference-accuracy", type=float, default=0.9,
                   help="reference accuracy assumed for Newcombe's interval (rows both right)")
    p.add_argument("--bootstrap-reps", type=int, default=1000,
                   help="Monte-Carlo samples per bootstrap row (0: skip the bootstrap rows)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval")
    p.add_argument("--seed", type=int, default=0, help="seed of the Monte-Carlo samples")
    return p


def main(**kwargs):
    t0 = time.perf_counter()
    rows = table(**kwargs)
    print(f"====== interval coverage at {kwargs.get('confidence', 0.95):g} nominal ======")
    print(markdown(rows))
    print(f"({time.perf_counter() - t0:.0f} s)")
    return rows


if __name__ == "__main__":
    main(**vars(configure_parser().parse_args()))
