"""Early-exit rules, threshold fitting and exit statistics: NumPy only (no MLX import).

Exit rules, checked after each intermediate head in order (the final layer always answers):

- ``entropy``: normalised entropy H(p)/log K below τ (DeeBERT, Xin et al. 2020, §2.2);
- ``margin``: top-2 probability margin p₁ − p₂ above τ;
- ``patience``: the last t heads agree on the argmax (PABEE, Zhou et al. 2020, §3.2; PABEE's
  patience p is t = p + 1 here).

p = softmax over the example's valid options of the head's logits divided by the temperature
(``temperature`` None = raw logits, as for minilm-sentiment; minilm-choice passes its per-K
temperature because its raw 20·cos logits are not probabilities). Used by the builder
(:mod:`variants.families.exit.build`). :func:`exit_summary` lives in :mod:`runs.exits`
(the report's early-exit table reads it without importing model code).
"""

import numpy as np

from metrics.softmax import masked_softmax
from runs.exits import exit_summary  # noqa: F401  (moved to runs: the plots use it)

RULES = ("entropy", "margin", "patience")
N_CANDIDATES = 400  # thresholds tried per rule on the calibration split


def masked_probs(logits, mask=None, temperature=None):
    """softmax(logits / T) over valid options.

    Parameters
    ----------
    logits : array-like (n, K) float
    mask : array-like (n, K) bool, optional (None = every option valid)
    temperature : array-like (n,) float > 0, optional (None = 1)

    Returns
    -------
    ndarray (n, K) float64, 0 at invalid options.
    """
    return masked_softmax(logits, mask, temperature)


def predictions(logits, mask=None):
    """(n,) int: argmax over valid options (invalid entries never win, even when logits < 0)."""
    z = np.asarray(logits, np.float64)
    if mask is not None:
        z = np.where(np.asarray(mask, bool), z, -np.inf)
    return z.argmax(-1)


def rule_statistic(logits, rule, mask=None, temperature=None):
    """Per-example statistic of a head's logits (n, K): normalised entropy H(p)/log K_i (entropy;
    0 when K_i = 1) or top-2 probability margin p₁ − p₂ (margin; 1 when K_i = 1).
    A rule fires when entropy < τ, margin > τ. See :func:`masked_probs` for mask/temperature.

    Raises
    ------
    ValueError
        For patience (it has no per-head statistic) or an unknown rule.
    """
    p = masked_probs(logits, mask, temperature)
    k = p.shape[-1] if mask is None else np.asarray(mask, bool).sum(-1)
    if rule == "entropy":
        h = -(p * np.log(np.clip(p, 1e-30, 1))).sum(-1)
        return np.where(np.asarray(k) > 1, h / np.log(np.maximum(k, 2)), 0.0)
    if rule == "margin":
        top = np.sort(p, axis=-1)
        return top[:, -1] - top[:, -2] if p.shape[-1] > 1 else np.ones(len(p))
    raise ValueError(f"exit rule {rule!r} has no statistic; choose entropy or margin")


def fires(stat_or_run, rule, threshold):
    """Boolean (n,): does ``rule`` fire. For patience pass the current agreement run length."""
    if rule == "entropy":
        return stat_or_run < threshold
    if rule == "margin":
        return stat_or_run > threshold
    if rule == "patience":
        return stat_or_run >= threshold
    raise ValueError(f"exit rule {rule!r} is not known; choose one of {RULES}")


def never_fires(rule, threshold, n_heads):
    """True when ``rule`` at ``threshold`` cannot fire on any input: normalised entropy is never
    < 0, a probability margin never > 1, and patience t cannot exceed the number of heads. Such a
    variant runs no intermediate head at all (its forward is the reference's)."""
    if rule == "entropy":
        return threshold <= 0
    if rule == "margin":
        return threshold >= 1
    if rule == "patience":
        return threshold > n_heads
    raise ValueError(f"exit rule {rule!r} is not known; choose one of {RULES}")


def simulate(head_logits, final_logits, rule, threshold, layers, n_layers, mask=None,
             temperature=None):
    """Exit layer and answer of each example given every head's logits (no model run).

    Parameters
    ----------
    head_logits : list of ndarray (n, K), one per exit layer in ``layers``
    final_logits : ndarray (n, K)
        The model's own final head (the variant's answer when no rule fires).
    mask, temperature : see :func:`masked_probs`.

    Returns
    -------
    exit_layer : ndarray (n,) int (1-based layer whose head answered; N = no early exit)
    logits : ndarray (n, K)
    """
    n = len(final_logits)
    exit_layer = np.full(n, n_layers, np.int64)
    out = np.array(final_logits, np.float64)
    done = np.zeros(n, bool)
    run = np.zeros(n, np.int64)
    prev = np.full(n, -1)
    for lg, l in zip(head_logits, layers):
        pred = predictions(lg, mask)
        run = np.where(pred == prev, run + 1, 1)
        prev = pred
        s = run if rule == "patience" else rule_statistic(lg, rule, mask, temperature)
        f = fires(s, rule, threshold) & ~done
        exit_layer[f] = l
        out[f] = lg[f]
        done |= f
    return exit_layer, out


def fit_threshold(head_logits, final_logits, ref_pred, rule, target, layers, n_layers, mask=None,
                  temperature=None):
    """The cheapest threshold whose agreement with ``ref_pred`` reaches ``target``.

    Candidates: quantiles of the rule statistic over all heads (entropy, margin), or t = 2..H
    (patience); plus one that never fires (entropy 0, margin 1, patience H + 1), so a target is
    always met by an unquantized base. Returns ``(threshold, agreement, expected cost)``; cost =
    mean fraction of layers. When no candidate reaches ``target`` (a quantized base disagrees
    with the reference on its own), the candidate with the highest agreement (then the lowest
    cost) is returned: the caller sees ``agreement < target`` and reports it.
    """
    if rule == "patience":
        cands = [float(t) for t in range(2, len(layers) + 1)] + [float(len(layers) + 1)]
    else:
        stats = np.concatenate([rule_statistic(lg, rule, mask, temperature)
                                for lg in head_logits])
        qs = np.unique(np.quantile(stats, np.linspace(0, 1, N_CANDIDATES)))
        never = 0.0 if rule == "entropy" else 1.0
        cands = [never] + (qs.tolist() if rule == "entropy" else qs[::-1].tolist())
    best, closest = None, None
    for t in cands:
        el, lg = simulate(head_logits, final_logits, rule, t, layers, n_layers, mask, temperature)
        agree = float((predictions(lg, mask) == ref_pred).mean())
        cost = float(el.mean() / n_layers)
        if agree >= target and (best is None or cost < best[2] - 1e-12):
            best = (float(t), agree, cost)
        if closest is None or (agree, -cost) > (closest[1], -closest[2]):
            closest = (float(t), agree, cost)
    return best if best is not None else closest


def summary_lines(s, split):
    """Markdown lines for an :func:`exit_summary` dict ``s`` of split ``split`` (a word)."""
    hist = ", ".join(f"L{k}: {v}" for k, v in s["exit_histogram"].items())
    lines = [f"- {split} exit histogram {hist} (n={s['n']}); expected cost "
             f"{s['expected_cost']:.3f} of the layers → ideal speed-up {s['ideal_speedup']:.2f}×;"
             f" {s['exited_early_share']:.0%} exited early"]
    if s.get("n_near_tie"):
        other = s["other_mean_exit_layer"]
        lines.append(f"- {split} near ties (reference margin < {s['near_tie_margin']:g}, "
                     f"n={s['n_near_tie']}): mean exit layer {s['near_tie_mean_exit_layer']:.2f} "
                     f"vs {'—' if other is None else f'{other:.2f}'} for the rest; "
                     f"{s['near_tie_ran_all_share']:.0%} ran every layer vs "
                     f"{'—' if other is None else format(s['other_ran_all_share'], '.0%')}")
    return lines
