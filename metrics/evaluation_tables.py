"""Report tables of an evaluation: temperatures refitted per option-count bucket, and the
certified bounds implied by ε beside the observed worst case (a mixin of
:class:`metrics.evaluation.Evaluation`)."""

import numpy as np
import pandas as pd

from metrics.bounds import kl_bound, log_ratio_bound, tv_bound
from metrics.calibration import calibration_error
from metrics.softmax import masked_softmax
from metrics.temperature_fit import fits_by_bucket

#: Tolerances of the bound check: an observed value counts as above its bound only beyond
#: ``bound + BOUND_ATOL + BOUND_RTOL * bound`` (float32 outputs carry ~1e-7 relative round-off,
#: float32 logits ~1e-7 * |logit| / T).
BOUND_ATOL = 1e-4
BOUND_RTOL = 1e-3


class EvaluationTables:
    """``temperature_table`` and ``bounds_table`` of :class:`metrics.evaluation.Evaluation`."""

    def temperature_table(self):
        """Per option-count bucket: deployed T, T refitted (NLL) for reference and variant, and
        the variant's ECE at the deployed and at its refitted temperature.

        Returns
        -------
        pandas.DataFrame
            Columns ``n_options``, ``n``, ``T_deployed``, ``T_refit_ref``, ``T_refit_variant``,
            ``ece_variant``, ``ece_variant_refit`` (equal-width, targets as ``self.targets``),
            ``refit_status_ref``, ``refit_status_variant`` ("converged", "at_bound",
            "not_converged"; see :mod:`metrics.temperature_fit`).
        """
        if "temperature_table" in self._cache:  # the Markdown and JSON reports both ask
            return self._cache["temperature_table"].copy()
        rows = []
        k = self.option_mask.sum(axis=1)
        fits_ref = fits_by_bucket(self.ref_logits, self.option_mask, self.targets)
        fits_var = fits_by_bucket(self.var_logits, self.option_mask, self.targets)
        t_ref = {kk: f.temperature for kk, f in fits_ref.items()}
        t_var = {kk: f.temperature for kk, f in fits_var.items()}
        for kk in sorted(t_ref):
            sel = k == kk
            mask = self.option_mask[sel]
            t_dep = float(np.median(self.temperature[sel])) if self.temperature is not None else np.nan
            ece_refit = np.nan
            if np.isfinite(t_var[kk]):
                ece_refit = calibration_error(masked_softmax(self.var_logits[sel], mask, t_var[kk]),
                                              self.targets[sel], mask, n_bins=self.n_bins)
            rows.append({"n_options": int(kk), "n": int(sel.sum()), "T_deployed": t_dep,
                         "T_refit_ref": t_ref[kk], "T_refit_variant": t_var[kk],
                         "ece_variant": calibration_error(self.var_probs[sel], self.targets[sel],
                                                          mask, n_bins=self.n_bins),
                         "ece_variant_refit": ece_refit,
                         "refit_status_ref": fits_ref[kk].status,
                         "refit_status_variant": fits_var[kk].status})
        self._cache["temperature_table"] = pd.DataFrame(rows)
        return self._cache["temperature_table"].copy()

    def bounds_table(self, epsilon=None):
        """Certified bounds implied by ``epsilon`` per temperature bucket, beside the observed
        worst case on the examples where ``epsilon`` held (``max|Δlogit| <= epsilon``).

        Parameters
        ----------
        epsilon : float, optional
            Default ``self.epsilon`` (the certificate's ε).

        Returns
        -------
        pandas.DataFrame
            One row per (option count, temperature): ``n_options``, ``T``, ``n_held`` (rows where
            ε held), ``2eps_over_T``, and for each quantity a ``*_bound`` and ``*_observed`` pair:
            ``log_ratio`` (options; ratio bound = exp of it), ``action_log_ratio``, ``tv``,
            ``kl``, ``score`` (|Δ expected score|, bound uses the bucket's widest score range),
            plus ``violated`` (names of quantities whose observed value exceeds the bound). Empty
            when the outputs carry no temperature.
        """
        if self.temperature is None:
            return pd.DataFrame()
        eps = self.epsilon if epsilon is None else float(epsilon)
        d, df = self.detail, self.per_example
        held = df["max_abs_logit_diff"].to_numpy() <= eps
        rows = []
        keys = np.stack([df["n_options"].to_numpy(), np.round(self.temperature, 6)], axis=1)
        for k, t in sorted({tuple(x) for x in keys.tolist()}):
            sel = (keys[:, 0] == k) & (keys[:, 1] == t) & held
            b = float(log_ratio_bound(eps, t))
            srange = np.nanmax(d["score_range"].to_numpy()[sel]) if sel.any() and \
                np.isfinite(d["score_range"].to_numpy()[sel]).any() else np.nan

            def worst(col):
                v = (d[col] if col in d else df[col]).to_numpy(dtype=np.float64)[sel]
                v = v[~np.isnan(v)]
                return float(v.max()) if v.size else np.nan

            row = {"n_options": int(k), "T": float(t), "n_held": int(sel.sum()), "2eps_over_T": b,
                   "log_ratio_bound": b, "log_ratio_observed": worst("log_ratio_max"),
                   "action_log_ratio_bound": b, "action_log_ratio_observed": worst("action_log_ratio_max"),
                   "tv_bound": float(tv_bound(eps, t)), "tv_observed": worst("prob_tv"),
                   "kl_bound": float(kl_bound(eps, t)), "kl_observed": worst("kl"),
                   "score_bound": float(tv_bound(eps, t)) * srange,
                   "score_observed": worst("abs_score_error")}
            row["violated"] = ",".join(
                q for q in ("log_ratio", "action_log_ratio", "tv", "kl", "score")
                if row[f"{q}_observed"] > row[f"{q}_bound"] + BOUND_ATOL + BOUND_RTOL * row[f"{q}_bound"])
            rows.append(row)
        return pd.DataFrame(rows)
