"""Expected calibration error of top-label confidence.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``expected_calibration_error`` is lower-is-better (0 = perfectly calibrated).
"""

import numpy as np

from metrics._checks import check_labels, check_mask
from metrics.defaults import N_BINS


def _bin_index(confidence, n_bins):
    """Bin of each confidence for equal-width bins ``((m-1)/M, m/M]``; 0 goes to the first bin."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.clip(np.digitize(confidence, edges, right=True) - 1, 0, n_bins - 1)


def expected_calibration_error(probs, labels, option_mask, *, n_bins=N_BINS):
    """Top-label expected calibration error with equal-width confidence bins.

    Confidence is the largest probability among valid options, the prediction its option. With
    bins ``B_m = ((m-1)/M, m/M]`` over the labeled examples (n of them),
    ``ECE = sum_m |B_m|/n * |acc(B_m) - conf(B_m)|``.

    Parameters
    ----------
    probs : array-like of shape (N, K), float
        Option probabilities (after temperature); entries outside ``option_mask`` are ignored.
    labels : array-like of shape (N,), int
        Gold option index; negative (-1) = unknown, excluded.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.
    n_bins : int, default=N_BINS (15, :mod:`metrics.defaults`)
        Number of equal-width bins on [0, 1].

    Returns
    -------
    ece : float
        In [0, 1]; lower is better. NaN when no example is labeled.

    Raises
    ------
    ValueError
        If shapes disagree, probabilities are NaN or outside [0, 1] (+1e-6), a row has no valid
        option, or ``n_bins`` < 1.

    References
    ----------
    C. Guo et al., "On Calibration of Modern Neural Networks", ICML 2017, Sec. 2 (Eq. 3);
    M. P. Naeini et al., "Obtaining Well Calibrated Probabilities Using Bayesian Binning",
    AAAI 2015.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2-D of shape (N, K), got shape {probs.shape}.")
    mask = check_mask(option_mask, probs.shape)
    labels = check_labels(labels, probs.shape[0])
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins}.")
    valid = probs[mask]
    if np.isnan(valid).any() or (valid < 0).any() or (valid > 1 + 1e-6).any():
        raise ValueError("probs has NaN or values outside [0, 1] on valid options.")
    known = labels >= 0
    if not known.any():
        return float("nan")
    z = np.where(mask, probs, -np.inf)[known]
    pred = np.argmax(z, axis=1)
    confidence = np.minimum(z[np.arange(z.shape[0]), pred], 1.0)
    hit = (pred == labels[known]).astype(np.float64)
    b = _bin_index(confidence, int(n_bins))
    count = np.bincount(b, minlength=n_bins)
    gap = np.bincount(b, weights=hit - confidence, minlength=n_bins)
    return float(np.abs(gap).sum() / count.sum())


# -- beyond top-label equal-width ECE ----------------------------------------------------------
STRATEGIES = ("uniform", "quantile")


def _check_probs_targets(probs, targets, option_mask):
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2-D of shape (N, K), got shape {probs.shape}.")
    mask = check_mask(option_mask, probs.shape)
    targets = check_labels(targets, probs.shape[0], name="labels")
    valid = probs[mask]
    if np.isnan(valid).any() or (valid < 0).any() or (valid > 1 + 1e-6).any():
        raise ValueError("probs has NaN or values outside [0, 1] on valid options.")
    known = targets >= 0
    if (known & ~mask[np.arange(len(targets)), np.clip(targets, 0, probs.shape[1] - 1)]).any():
        raise ValueError("labels point at an option outside option_mask; fix the labels or the mask.")
    return np.where(mask, probs, 0.0), mask, targets, known


def equal_mass_sorted_bins(sorted_conf, n_bins):
    """Equal-mass bin of each position of ``sorted_conf`` (..., n), sorted along the last axis.

    The positions split as ``numpy.array_split(range(n), n_bins)`` (bins of n/M rows, the first
    ones one longer); then every run of equal confidences goes whole to the bin of its first
    copy, so tied values share one bin and the bins depend only on the values, never on the
    rows' order (a bin may then hold more or fewer rows, or none). Returns int64 of the same
    shape, non-decreasing along the last axis.
    """
    sorted_conf = np.asarray(sorted_conf)
    n = sorted_conf.shape[-1]
    sizes = [len(a) for a in np.array_split(np.arange(n), n_bins)]
    by_position = np.repeat(np.arange(n_bins, dtype=np.int64), sizes)
    new = np.ones(sorted_conf.shape, dtype=bool)
    new[..., 1:] = sorted_conf[..., 1:] != sorted_conf[..., :-1]
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0), axis=-1)
    return by_position[first]


def _bins(confidence, n_bins, strategy):
    """Bin index per example: equal-width ((m-1)/M, m/M], or equal-mass
    (:func:`equal_mass_sorted_bins`: sorted, split in M, ties kept in one bin)."""
    if strategy == "uniform":
        return _bin_index(confidence, n_bins)
    if strategy == "quantile":
        order = np.argsort(confidence, kind="stable")
        b = np.empty(confidence.size, dtype=np.int64)
        b[order] = equal_mass_sorted_bins(confidence[order], n_bins)
        return b
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")


def reliability_diagram(probs, labels, option_mask, *, n_bins=N_BINS, strategy="uniform"):
    """Data of a top-label reliability diagram: per bin its confidence, accuracy and count.

    Parameters
    ----------
    probs : array-like of shape (N, K), float
    labels : array-like of shape (N,), int
        Target option; negative = unknown (excluded).
    option_mask : array-like of shape (N, K), bool
    n_bins : int, default=N_BINS (15, :mod:`metrics.defaults`)
    strategy : {'uniform', 'quantile'}, default='uniform'
        Equal-width bins on [0, 1], or equal-mass bins (each holds N/M examples, ±1, except
        that tied confidences always share one bin: :func:`equal_mass_sorted_bins`).

    Returns
    -------
    bins : dict of ndarray of shape (M,)
        ``confidence`` (mean top probability, NaN for an empty bin), ``accuracy`` (share whose
        top option is the target), ``count`` (int), ``lower``/``upper`` (bin edges: fixed for
        'uniform', the smallest and largest confidence in the bin for 'quantile').

    See Also
    --------
    sklearn.calibration.calibration_curve : the binary analogue (``strategy`` has the same names).

    References
    ----------
    C. Guo et al., ICML 2017, Sec. 2 (reliability diagrams); A. Niculescu-Mizil and R. Caruana,
    ICML 2005.
    """
    probs, mask, targets, known = _check_probs_targets(probs, labels, option_mask)
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins}.")
    n_bins = int(n_bins)
    z = np.where(mask, probs, -np.inf)[known]
    pred = np.argmax(z, axis=1)
    conf = np.minimum(z[np.arange(z.shape[0]), pred], 1.0)
    hit = (pred == targets[known]).astype(np.float64)
    b = _bins(conf, n_bins, strategy)
    count = np.bincount(b, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(b, weights=conf, minlength=n_bins) / count
        acc = np.bincount(b, weights=hit, minlength=n_bins) / count
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        lower, upper = edges[:-1], edges[1:]
    else:
        lower = np.array([conf[b == m].min() if count[m] else np.nan for m in range(n_bins)])
        upper = np.array([conf[b == m].max() if count[m] else np.nan for m in range(n_bins)])
    return {"lower": lower, "upper": upper, "confidence": mean_conf, "accuracy": acc,
            "count": count.astype(np.int64)}


def calibration_error(probs, labels, option_mask, *, n_bins=N_BINS, strategy="uniform"):
    """Top-label ECE with equal-width (``'uniform'``) or equal-mass (``'quantile'``) bins.

    ``strategy='uniform'`` equals :func:`expected_calibration_error`. Equal-mass bins follow
    Nixon et al., "Measuring Calibration in Deep Learning", CVPR Workshops 2019 (adaptive ECE),
    with tied confidences kept in one bin (:func:`equal_mass_sorted_bins`), so the result is a
    function of the multiset of (confidence, hit) pairs, not of the rows' order.

    Returns
    -------
    ece : float
        In [0, 1], lower is better; NaN when no example has a target.
    """
    d = reliability_diagram(probs, labels, option_mask, n_bins=n_bins, strategy=strategy)
    n = d["count"].sum()
    if n == 0:
        return float("nan")
    gap = np.nan_to_num(d["accuracy"] - d["confidence"])
    return float(np.sum(d["count"] / n * np.abs(gap)))


def classwise_calibration_error(probs, labels, option_mask, *, n_bins=N_BINS):
    """Classwise ECE: the equal-width ECE of each option's probability, averaged over options.

    For option k, over examples with a target where k is valid: confidence ``p_k``, outcome
    ``[target == k]``; ``cwECE = (1/K') Σ_k Σ_m |B_mk|/n_k |acc(B_mk) - conf(B_mk)|`` with K' the
    options that occur.

    Returns
    -------
    ece : float
        In [0, 1], lower is better; NaN when no example has a target.

    References
    ----------
    M. Kull et al., "Beyond temperature scaling: Obtaining well-calibrated multiclass
    probabilities with Dirichlet calibration", NeurIPS 2019, Sec. 2 (classwise-ECE).
    """
    probs, mask, targets, known = _check_probs_targets(probs, labels, option_mask)
    per_class = []
    for k in range(probs.shape[1]):
        rows = known & mask[:, k]
        if not rows.any():
            continue
        conf = np.minimum(probs[rows, k], 1.0)
        hit = (targets[rows] == k).astype(np.float64)
        b = _bin_index(conf, int(n_bins))
        count = np.bincount(b, minlength=n_bins)
        gap = np.bincount(b, weights=hit - conf, minlength=n_bins)
        per_class.append(np.abs(gap).sum() / count.sum())
    return float(np.mean(per_class)) if per_class else float("nan")


def brier_loss(probs, labels, option_mask):
    """Multiclass Brier score: mean over examples of ``Σ_k (p_k - [target = k])²``.

    Returns
    -------
    brier : float
        In [0, 2], lower is better; NaN when no example has a target.

    See Also
    --------
    sklearn.metrics.brier_score_loss : the same for all-valid options (multiclass since 1.7).

    References
    ----------
    G. W. Brier, "Verification of forecasts expressed in terms of probability", Monthly Weather
    Review 78 (1950).
    """
    probs, mask, targets, known = _check_probs_targets(probs, labels, option_mask)
    if not known.any():
        return float("nan")
    onehot = np.zeros_like(probs)
    onehot[np.flatnonzero(known), targets[known]] = 1.0
    sq = np.where(mask, (probs - onehot) ** 2, 0.0)[known]
    return float(sq.sum(axis=1).mean())


def nll_loss(probs, labels, option_mask):
    """Negative log-likelihood of the target option from probabilities, mean over examples, nats.

    Uncapped: ``-log p`` of the target with no floor, so a target probability of exactly 0 gives
    inf. Float32 probabilities underflow to 0 below ~1e-45 (an NLL above ~103 nats); when logits
    exist use :func:`nll_from_logits`, which is exact.

    Returns
    -------
    nll : float
        >= 0 (inf when a target has probability 0), lower is better; NaN when no example has a
        target.

    See Also
    --------
    sklearn.metrics.log_loss : equal when every option is valid and no probability is below its
        clipping (the dtype's eps).
    """
    probs, mask, targets, known = _check_probs_targets(probs, labels, option_mask)
    if not known.any():
        return float("nan")
    p = probs[np.flatnonzero(known), targets[known]]
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.log(p)))


def nll_from_logits(logits, labels, option_mask, *, temperature=1.0):
    """Per-example NLL of the target under ``softmax(logits / T)``, exact, nats.

    ``-log_softmax(logits / T)[target]`` in float64 over valid options: no cap and no underflow
    (logits [50, 0] with target 1 at T = 1 give ``50 + log1p(exp(-50))``, where a float32
    probability floored at 1e-15 gives 34.54).

    Parameters
    ----------
    logits : array-like of shape (N, K), float
    labels : array-like of shape (N,), int
        Target option; negative = unknown.
    option_mask : array-like of shape (N, K), bool
    temperature : float or array-like of shape (N,), default=1.0
        Temperature per example (> 0), the one the probabilities were made with.

    Returns
    -------
    nll : ndarray of shape (N,), float64
        >= 0; NaN where the target is unknown. ``np.nanmean`` of it is the mean NLL.

    Raises
    ------
    ValueError
        If shapes disagree, a row has no valid option, a label points at an invalid option, a
        temperature is not > 0, or a valid logit is not finite.

    See Also
    --------
    sklearn.metrics.log_loss : the same mean on all-valid options, up to its probability clipping.
    """
    from metrics.logprobs import log_probs

    logp = log_probs(logits, option_mask, temperature)
    targets = check_labels(labels, logp.shape[0])
    known = targets >= 0
    rows = np.flatnonzero(known)
    if (logp[rows, targets[known]] == -np.inf).any() or (targets >= logp.shape[1]).any():
        raise ValueError("labels point at an option outside option_mask; fix the labels or the mask.")
    out = np.full(logp.shape[0], np.nan)
    out[rows] = 0.0 - logp[rows, targets[known]]  # 0.0 - 0.0 is +0.0, not -0.0
    return out
