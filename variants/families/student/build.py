"""The student family's build: a distilled shallower student + teacher fallback.

1. The student (:mod:`variants.families.student.train`): k of the teacher's N layers, trained by
   distillation (KL to the teacher's option probabilities at its temperature, optionally
   TinyBERT hidden-state matching) on the fit split plus the unlabelled rest of the training
   texts; cached under ``results/.cache/students/``.
2. The fallback (:mod:`variants.families.student.fallback`): τ fitted on the **calibration**
   split only, the lowest fallback rate q whose agreement with the teacher reaches the target.
3. c = the student's forward time / the teacher's, measured here (strictly alternated, on
   calibration batches); the variant's timed call (:class:`~variants.families.student.net.StudentNet`)
   runs the student on the batch and the teacher on the routed rows, so its measured latency
   is what the cost model c + q predicts (plus the routing sync and the sub-batch's padding).
"""

import warnings
from collections import OrderedDict

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from variants.families.exit.build import _head_kind, _kind_of_model_name
from variants.families.exit.heads import KINDS
from variants.families.exit.rules import predictions
from variants.families.readout import check_readout
from variants.families.student.fallback import fit_fallback
from variants.families.student.net import StudentNet
from variants.families.exit.heads import cosine_logits
from variants.families.student.train import trainable_encoder, trained_student
from variants.runtime.timing import time_alternating

C_ROUNDS = 5  # alternated rounds of the c measurement
C_BATCHES = 4  # calibration batches (spread over the lengths) per round

_STUDENTS = OrderedDict()  # (id(module), training config, fit fingerprint) -> (module, student, info)
_CAL = OrderedDict()  # (id(module), training config, calibration key) -> calibration facts


def check_model(module, cfgs, model=None):
    """Reject, before a sweep writes anything: a model without a logits kind the student can
    reproduce (marker / factory models), a module without per-layer access or a plain readout,
    and a student as deep as or deeper than the teacher.

    Raises
    ------
    ValueError
        Naming the flag (--student-layers, --model) and the fix.
    """
    kind = _kind_of_model_name(model) if model is not None else ...
    if kind is not ... and kind not in KINDS:
        raise ValueError(f"model {model} has no student head kind (one of {KINDS}): the student "
                         "shares a linear-head, classifier or cosine (scale 20) head, not marker "
                         "or factory ones; choose --family quant, lowrank or prune")
    if getattr(module, "encoder", None) is not None:
        check_readout(module, "student")
        layers = module.encoder.layers
    else:
        layers = getattr(module, "layers", None)
    if layers is None:
        raise ValueError(f"--model {model or '?'}: {type(module).__name__} has no per-layer "
                         "access (a `layers` list); --family student needs one")
    n = len(layers)
    if getattr(module, "encoder", None) is not None:
        trainable_encoder(module.encoder)
    deep = sorted({c.layers for c in cfgs if c.layers >= n})
    if deep:
        raise ValueError(f"--student-layers {' '.join(map(str, deep))}: a student must have "
                         f"fewer layers than the teacher's {n}; pass 1..{n - 1}")


def _calibration_logits(reference, module, calibration, kind, batches):
    """(n, K) float64 raw logits of ``module`` (a decision module, its own fast forward) on
    the calibration split."""
    out = np.zeros(calibration.option_mask.shape, np.float64)
    O = reference._options() if kind == "cosine" else None
    for b in batches:
        z = module(b.input_ids, b.attention_mask, b.token_type_ids)
        if kind == "cosine":
            z = cosine_logits(z, O[mx.maximum(b.option_index, 0)], b.option_index >= 0)
        out[b.index] = np.array(z.astype(mx.float32))
    return out


def measure_c(teacher, student, batches, rounds=C_ROUNDS):
    """c = median over strictly alternated rounds of (student forward ms / teacher forward ms),
    each round running up to ``C_BATCHES`` of ``batches`` (spread over the lengths) through the
    decision modules' plain call (their fast paths) with ``mx.eval``. Returns (c, note)."""
    pick = [batches[i] for i in np.unique(np.linspace(0, len(batches) - 1, C_BATCHES).round()
                                          .astype(int))]

    def runner(m):
        return lambda: [m(b.input_ids, b.attention_mask, b.token_type_ids) for b in pick]

    r = time_alternating(runner(teacher), runner(student), warmup=1, rounds=rounds,
                         min_rounds=rounds, budget_s=60.0)
    ratio = np.asarray(r["var_ms"]) / np.asarray(r["ref_ms"])
    return float(np.median(ratio)), (f"median of {len(ratio)} alternated rounds over "
                                      f"{len(pick)} calibration batches of "
                                      f"{len(pick[0].index)} texts")


def build(reference, cfg, calibration=None, fit=None, cache_dir=None, mode="simulated",
          log=None):
    """The student variant of ``cfg`` (:class:`StudentConfig`): (DecisionModel, build.json dict).

    Parameters
    ----------
    reference : DecisionModel, calibrated (the teacher; its temperatures read the rule)
    cfg : StudentConfig
    calibration : TaskSet — the fallback threshold is fitted on it (never on eval); required
    fit : TaskSet — the fit split (its texts train the student, with the unlabelled rest)
    cache_dir : Path, optional — students are cached in ``cache_dir/students/``
    mode : ignored (no quantization here; accepted for the family interface)

    Returns
    -------
    variant : DecisionModel whose module is a :class:`StudentNet`
    info : dict — ``student_layers``, ``teacher_layers``, ``init``, ``init_layers``,
        ``training`` (curve per epoch, seconds, texts), ``rule``, ``threshold``, ``target``,
        ``calibration_agreement`` / ``calibration_q`` / ``calibration_student_agreement``,
        ``c`` (measured) and ``c_note``, ``expected_cost`` = c + q (calibration),
        ``ideal_speedup``, ``model_bytes`` (teacher + the student's own layers).

    Raises
    ------
    ValueError
        No calibration or fit split, a model the family cannot hold, a student not shallower
        than the teacher, or a target whose threshold leaves the student no calibration row
        (names --fallback-targets).
    """
    if calibration is None or fit is None:
        raise ValueError("the student family needs the fit split (training texts) and the "
                         "calibration split (fallback threshold): build(..., calibration=, fit=)")
    kind = _head_kind(reference)
    module = reference.module
    check_model(module, [cfg])
    n = len(module.encoder.layers)
    skey = (id(module), tuple(sorted(cfg.training.items())), fit.fingerprint())
    hit = _STUDENTS.get(skey)
    if hit is not None and hit[0] is module:
        student, tinfo = hit[1], dict(hit[2], student_cached=True)
    else:
        student, tinfo = trained_student(reference, cfg, kind, fit, cache_dir=cache_dir,
                                         log=log)
        _STUDENTS[skey] = (module, student, tinfo)
        while len(_STUDENTS) > 4:
            _STUDENTS.popitem(last=False)
    ckey = skey[:2] + (reference.cache_key(calibration.fingerprint()),)
    cal = _CAL.get(ckey)
    if cal is None or cal[0] is not module:
        batches, _ = reference.prepare(calibration)
        t_logits = _calibration_logits(reference, module, calibration, kind, batches)
        s_logits = _calibration_logits(reference, student, calibration, kind, batches)
        c, c_note = measure_c(module, student, batches)
        cal = (module, t_logits, s_logits, c, c_note)
        _CAL[ckey] = cal
        while len(_CAL) > 4:
            _CAL.popitem(last=False)
    _, t_logits, s_logits, c, c_note = cal
    mask = np.asarray(calibration.option_mask, bool)
    temp = reference.temperature_of(calibration).astype(np.float64)
    ref_pred = predictions(t_logits, mask)
    fb = fit_fallback(s_logits, t_logits, ref_pred, cfg.rule, cfg.target, mask, temp)
    if not fb["reached"] or fb["q"] >= 1.0:
        raise ValueError(f"--fallback-targets {cfg.target}: no fallback threshold reaches it "
                         f"with the {cfg.layers}-layer student answering any calibration "
                         f"example (best: agreement {fb['agreement']:.4f} at q = "
                         f"{fb['q']:.3f}; the student alone agrees "
                         f"{fb['student_agreement']:.4f}); lower --fallback-targets or train "
                         "a deeper student (--student-layers)")
    if c + fb["q"] >= 1.0:
        warnings.warn(f"student {cfg.name}: cost model c + q = {c:.3f} + {fb['q']:.3f} >= 1 on "
                      "calibration (the fallback routes too much): no speed-up expected",
                      stacklevel=2)
    wrapper = StudentNet(student, module, cfg.rule, fb["threshold"], kind=kind,
                         temperatures=reference.temperatures)
    teacher_bytes = int(sum(v.nbytes for _, v in tree_flatten(module.parameters())))
    own = int(sum(v.nbytes for _, v in tree_flatten(student.encoder.parameters()["layers"])))
    info = {"student_layers": int(cfg.layers), "teacher_layers": n, "init": cfg.init,
            "head_kind": kind, "rule": cfg.rule, "target": cfg.target,
            "threshold": fb["threshold"], "threshold_fitted_on": "calibration",
            "rule_probabilities": "softmax(student logits / the teacher's per-K temperature)",
            "calibration_agreement": fb["agreement"], "calibration_q": fb["q"],
            "calibration_student_agreement": fb["student_agreement"],
            "n_calibration": int(len(ref_pred)), "c": c, "c_note": c_note,
            "expected_cost": c + fb["q"], "work_ratio": c + fb["q"],
            "ideal_speedup": 1.0 / (c + fb["q"]),
            "ideal_speedup_note": "1 / (c + q) with c measured and q the calibration fallback "
                                  "rate (build.json 'eval' has q on the eval split)",
            "model_bytes": teacher_bytes + own, "student_own_bytes": own,
            "model_bytes_note": "the teacher (kept for the fallback) + the student's own layers "
                                "(embeddings and head are shared)",
            "bits_per_weight": 32.0, "bits_per_weight_note": "fp32 weights (not quantized)",
            **tinfo}
    return reference.replace_module(wrapper), info
