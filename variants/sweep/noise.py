"""The reference's own numerical noise: its eval logits on a second compute path.

The same weights give float32 logits whose last bits depend on the compute path (the compiled
encoder layers or MLX's own ops, the BLAS, the CPU's vector width). A row whose reference top-two
margin is within that noise has no stable answer: another machine may rank its top two the
other way with no approximation at all. The sweep measures the noise on every run — the largest
``|Δlogit|`` over the eval rows' valid options between the reference's outputs and the same
model on the plain MLX path (:mod:`variants.runtime.plain`) — and records it in run.json
(``reference_noise``); the judge's ``numerical_tie`` stratum is the rows whose reference margin
is at most :data:`metrics.defaults.NUMERICAL_TIE_MULTIPLE` times it (:func:`metrics.evaluate.
evaluate`, ``numerical_noise``), and flips there are reported apart.

The plain path's raw logits are cached like the reference's outputs (their cache key carries
the compute path, :mod:`variants.arch.compute_path`), so a warm cache runs nothing.
"""

import numpy as np

from metrics.defaults import NUMERICAL_TIE_MULTIPLE
from runs.io import write_npz

#: what the second path is, as run.json says it
SECOND_PATH = "the plain MLX path (compiled layers and kernels off)"


def max_abs_logit_diff(a, b, mask):
    """Largest ``|a - b|`` over the valid entries of (N, K) logits (0.0 when none), float."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.where(np.asarray(mask, bool), np.abs(a - b), 0.0)
    return float(d.max(initial=0.0))


def reference_noise(sweep, key_of):
    """``{"max_abs_logit_diff", "second_path", "rows", "multiple", "tie_margin"}``: the
    reference's eval logits against the same model on the plain path (logit units).

    Parameters
    ----------
    sweep : variants.sweep.run.Sweep
        After :meth:`~variants.sweep.run.Sweep.reference` has computed its eval outputs.
    key_of : callable
        ``key_of(split) -> str``, the reference outputs' cache key of ``split`` as the compute
        path is now (called inside the plain block, so the key names that path).
    """
    from variants.runtime import plain

    model, ts = sweep.ref_model, sweep.tasksets["eval"]
    with plain.plain():
        path = sweep.cache / "reference" / f"{sweep.cfg.model}-eval-plain-{key_of('eval')}.npz"
        if path.exists():
            logits = np.load(path)["logits"]
        else:
            logits = np.asarray(model.raw_logits(ts, sweep.batches["eval"]), np.float32)
            sweep.clock.counts["reference_output_batches"] += len(sweep.batches["eval"])
            write_npz(path, {"logits": logits})
    ref = sweep.ref_outputs["eval"]
    return noise_record(ref.logits, logits, ref.option_mask)


def noise_record(ref_logits, plain_logits, mask):
    """``{"max_abs_logit_diff", "second_path", "rows", "multiple", "tie_margin"}`` of the
    reference's (N, K) logits against the plain path's on the same rows."""
    noise = max_abs_logit_diff(ref_logits, plain_logits, mask)
    return {"max_abs_logit_diff": noise, "second_path": SECOND_PATH,
            "rows": int(np.shape(ref_logits)[0]), "multiple": NUMERICAL_TIE_MULTIPLE,
            "tie_margin": NUMERICAL_TIE_MULTIPLE * noise}
