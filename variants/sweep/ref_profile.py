"""The reference forward's segment profile and its Amdahl ceilings, as run.json records them.

A sweep profiles its reference once (:func:`reference_profile`), on the texts of its largest
timing batch (at most :data:`MAX_TEXTS` of them), with :func:`variants.sweep.profile.segment_profile`,
and bounds its family's end-to-end speed-up with
:func:`variants.sweep.profile.amdahl_ceilings` (run.json ``segment_profile``; the HTML report's
"where the sweep's time went" section shows it). When it cannot, the record is one line
(``skipped``) saying why.
"""

import math

from variants.arch.encoder import BertEncoder
from variants.sweep.profile import FAMILY_SEGMENTS, amdahl_ceilings, segment_profile

#: The most texts profiled (one batch): the default B=32 timing batch.
MAX_TEXTS = 32
#: Rounds and warm-up rounds of the profile (~0.3-1 s for MiniLM at B=32 on 2 loaded cores).
ROUNDS, WARMUP = 3, 1
#: Below this many timing rounds (--timing-rounds) the sweep asked for a quick, rough timing:
#: the profile is skipped too.
MIN_TIMING_ROUNDS = 3
#: Segments each family makes cheaper: :data:`variants.sweep.profile.FAMILY_SEGMENTS`, and w8a8
#: (weights and activations of the encoder GEMMs in int8) like quant.
FAMILIES = dict(FAMILY_SEGMENTS, w8a8=FAMILY_SEGMENTS["quant"])


def skip_reason(ref_model, timing_rounds):
    """Why the reference cannot or should not be profiled (one line), or None when it can."""
    encoder = getattr(getattr(ref_model, "module", None), "encoder", None)
    if not isinstance(encoder, BertEncoder):
        return (f"not profiled: the segment profile times BERT-style encoders only, the "
                f"reference's is {type(encoder).__name__}")
    if not hasattr(ref_model.module, "head") and not hasattr(ref_model, "_options"):
        return (f"not profiled: the segment profile times a module head or the option-cosine "
                f"step, and a {type(ref_model).__name__} reads its logits otherwise")
    if timing_rounds < MIN_TIMING_ROUNDS:
        return (f"not profiled: --timing-rounds {timing_rounds} < {MIN_TIMING_ROUNDS} asks for a "
                "rough timing")
    return None


def _finite(x):
    return float(x) if math.isfinite(x) else None


def reference_profile(ref_model, timing_sets, family, timing_rounds):
    """run.json's ``segment_profile``: the reference forward's segments and the Amdahl ceilings.

    Parameters
    ----------
    ref_model : variants.models.decision.DecisionModel
        The sweep's reference.
    timing_sets : dict {int: (TaskSet, int)}
        :func:`variants.sweep.timing.timing_batches`; the largest batch size's texts are
        profiled, the first ``min(B, MAX_TEXTS)`` of them as one batch.
    family : str
        The sweep's family (``--family``).
    timing_rounds : int
        ``--timing-rounds``; below :data:`MIN_TIMING_ROUNDS` nothing is profiled.

    Returns
    -------
    dict
        ``{"skipped": reason}`` (one line) when :func:`skip_reason` says so, else the
        :func:`segment_profile` dict (times in ms, ``share`` {segment: p} summing to <= 1 with
        ``unattributed_share`` the rest) plus ``family``, ``ceilings`` {family: {"share": p,
        "ceiling": 1 / (1 - p)}} for every family of :data:`FAMILIES` (ceiling None when p = 1)
        and ``family_ceiling`` (the run family's entry; None for a family without a segment
        list, with ``family_note`` saying so).
    """
    reason = skip_reason(ref_model, timing_rounds)
    if reason is not None:
        return {"skipped": reason}
    b = max(timing_sets)
    texts = list(timing_sets[b][0].texts)[:min(b, MAX_TEXTS)]
    prof = segment_profile(ref_model, texts, rounds=ROUNDS, warmup=WARMUP)
    ceilings = {f: {"share": float(p), "ceiling": _finite(c)}
                for f, (p, c) in amdahl_ceilings(prof, FAMILIES).items()}
    out = dict(prof, family=family, ceilings=ceilings, family_ceiling=ceilings.get(family))
    if family not in ceilings:
        out["family_note"] = (f"{family} has no segment list (it changes the model as a whole): "
                              "no Amdahl ceiling from segments")
    return out
