"""Summaries of a per-example drift distribution, as llama.cpp's perplexity tool reports KL.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; these
summaries inherit the direction of the values summarised.
"""

import numpy as np

#: Percentiles reported, in llama.cpp's order (tools/perplexity/perplexity.cpp, KL divergence).
PERCENTILES = (("max", 100.0), ("p99.9", 99.9), ("p99", 99.0), ("p95", 95.0), ("p90", 90.0),
               ("median", 50.0), ("p10", 10.0), ("p5", 5.0), ("p1", 1.0), ("min", 0.0))


def describe(values):
    """Mean ± standard error, RMS and tail percentiles of a per-example quantity.

    Parameters
    ----------
    values : array-like of shape (N,), float
        NaN values (undefined rows) are dropped.

    Returns
    -------
    summary : dict
        ``n``, ``mean``, ``sem`` (``std(ddof=1)/sqrt(n)``, NaN when n < 2), ``rms`` and the keys
        of ``PERCENTILES`` (``numpy.percentile``, linear). All NaN when n = 0.

    References
    ----------
    ggml-org/llama.cpp, tools/perplexity/perplexity.cpp (``--kl-divergence`` statistics).

    Examples
    --------
    >>> describe([1.0, 2.0, 3.0])["median"]
    2.0
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    out = {"n": int(v.size)}
    if v.size == 0:
        return {**out, "mean": np.nan, "sem": np.nan, "rms": np.nan,
                **{k: np.nan for k, _ in PERCENTILES}}
    out["mean"] = float(v.mean())
    out["sem"] = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    out["rms"] = float(np.sqrt(np.mean(v ** 2)))
    with np.errstate(invalid="ignore"):
        for k, q in PERCENTILES:
            out[k] = float(np.percentile(v, q))
    return out
