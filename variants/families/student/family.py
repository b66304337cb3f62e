"""The student family (a distilled shallower encoder + teacher fallback): config, flags, ladder
and report lines. No MLX: training is :mod:`variants.families.student.train`, the fallback
forward :mod:`variants.families.student.net`, the build :mod:`variants.families.student.build`.
"""

import math
from dataclasses import dataclass

from variants.families import name_number, unique_by_name
from variants.families.family import BuildInputs, Family
from variants.families.student.config import TRAIN_BATCH  # noqa: F401

RULES = ("entropy", "margin")  # as early exit's (variants.families.exit.rules)
INITS = ("first", "even")
DEFAULT_LAYERS = (1, 2, 3)
DEFAULT_TARGETS = (0.99, 0.97)
# Training defaults, measured on minilm-sentiment (k = 2, 300 fit texts, agreement of the student
# alone with the teacher; the gap between the training texts and calibration is data-limited
# generalisation, not a target bug, see tests/families/test_student.py::test_full_depth_student_*):
#   600 texts, 3 epochs, lr 3e-5: train 0.857, calibration 0.700 (loss 0.179 -> 0.034)
#   600 texts, 3 epochs, lr 1e-4: train 0.887, calibration 0.673 (more memorisation)
#  1500 texts, 2 epochs, lr 1e-4: train 0.810, calibration 0.743 (the default)
DEFAULT_EPOCHS = 2
DEFAULT_TRAIN_TEXTS = 1500
DEFAULT_LR = 1e-4
DEFAULT_HIDDEN_WEIGHT = 0.0


@dataclass(frozen=True)
class StudentConfig:
    """One student variant (validated on creation; "shallower than the teacher" is checked by
    :func:`variants.families.student.build.check_model`, which knows the teacher's depth).

    ``layers``: encoder layers of the student (initialised from the teacher's, ``init``:
    'first' = layers 0..k−1, the default: after 3 epochs on 300 MiniLM texts its distillation
    loss was 0.127 vs 0.152 ('even') at k = 1 and 0.081 vs 0.187 at k = 2; 'even' = teacher
    layers round((j + 1)·N/k) − 1, TinyBERT's uniform map);
    ``target``: calibration agreement with the teacher the fallback threshold must reach;
    ``rule``: the student's confidence (normalised entropy below τ, or top-2 margin above τ:
    else the example goes to the teacher); ``epochs``, ``train_texts`` (fit split + unlabelled
    remainder of the training texts, at most this many), ``lr`` (AdamW), ``hidden_weight``
    (weight of TinyBERT hidden-state matching; 0 = KL only).
    """

    layers: int = 2
    target: float = 0.99
    rule: str = "entropy"
    init: str = "first"
    epochs: int = DEFAULT_EPOCHS
    train_texts: int = DEFAULT_TRAIN_TEXTS
    lr: float = DEFAULT_LR
    hidden_weight: float = DEFAULT_HIDDEN_WEIGHT

    def __post_init__(self):
        if isinstance(self.layers, bool) or int(self.layers) != self.layers or self.layers < 1:
            raise ValueError(f"--student-layers {self.layers} must be an integer >= 1 (and "
                             "fewer than the teacher's layers); pass e.g. --student-layers 1 2 3")
        t = self.target
        if not (isinstance(t, (int, float)) and math.isfinite(t) and 0 < t <= 1):
            raise ValueError(f"--fallback-targets {t} is outside (0, 1]; it is the calibration "
                             "agreement with the teacher to reach, e.g. --fallback-targets 0.99")
        if self.rule not in RULES:
            raise ValueError(f"--fallback-rule {self.rule!r} is not known; choose one of {RULES}")
        if self.init not in INITS:
            raise ValueError(f"--student-init {self.init!r} is not known; choose one of {INITS}")
        if int(self.epochs) != self.epochs or self.epochs < 1:
            raise ValueError(f"--student-epochs {self.epochs} must be an integer >= 1")
        if int(self.train_texts) != self.train_texts or self.train_texts < 1:
            raise ValueError(f"--student-train-texts {self.train_texts} must be an integer >= 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--student-lr {self.lr} must be a finite number > 0, e.g. 1e-4")
        if not (math.isfinite(self.hidden_weight) and self.hidden_weight >= 0):
            raise ValueError(f"--student-hidden-weight {self.hidden_weight} must be >= 0")

    @property
    def training(self):
        """The fields that decide the trained student (the fallback target and rule do not:
        one student serves every target)."""
        return dict(layers=int(self.layers), init=self.init, epochs=int(self.epochs),
                    train_texts=int(self.train_texts), lr=float(self.lr),
                    hidden_weight=float(self.hidden_weight))

    @property
    def name(self):
        s = f"student-l{self.layers}-{self.rule}-ag{name_number(self.target, '.3g')}"
        if self.init != "first":
            s += f"-{self.init}"
        if self.epochs != DEFAULT_EPOCHS:
            s += f"-e{self.epochs}"
        if self.train_texts != DEFAULT_TRAIN_TEXTS:
            s += f"-n{self.train_texts}"
        if self.lr != DEFAULT_LR:
            s += f"-lr{name_number(self.lr, '.3g')}"
        if self.hidden_weight:
            s += f"-hid{name_number(self.hidden_weight, '.3g')}"
        return s


PARAMS = ("student_layers", "fallback_targets", "fallback_rule", "student_init",
          "student_epochs", "student_train_texts", "student_lr", "student_hidden_weight")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("student family (--family student)")
    g.add_argument("--student-layers", type=int, nargs="+", default=list(DEFAULT_LAYERS),
                   metavar="K", help="encoder layers of each student (1 <= K < the teacher's)")
    g.add_argument("--fallback-targets", type=float, nargs="+", default=list(DEFAULT_TARGETS),
                   metavar="A", help="calibration agreement with the teacher each fallback "
                                     "threshold must reach, in (0, 1]")
    g.add_argument("--fallback-rule", choices=RULES, default="entropy",
                   help="student confidence: normalised entropy (below τ answers) or top-2 "
                        "probability margin (above τ answers); else the teacher answers")
    g.add_argument("--student-init", choices=INITS, default="first",
                   help="teacher layers copied into the student: first = the first K (default: "
                        "lower distillation loss than even on MiniLM at K = 1, 2), even = "
                        "round((j+1)N/K)-1 (TinyBERT's uniform map)")
    g.add_argument("--student-epochs", type=int, default=DEFAULT_EPOCHS,
                   help="distillation epochs")
    g.add_argument("--student-train-texts", type=int, default=DEFAULT_TRAIN_TEXTS,
                   help="training texts: the fit split plus the unlabelled rest of the "
                        "training texts, at most this many")
    g.add_argument("--student-lr", type=float, default=DEFAULT_LR, help="AdamW learning rate")
    g.add_argument("--student-hidden-weight", type=float, default=DEFAULT_HIDDEN_WEIGHT,
                   help="weight of TinyBERT hidden-state matching (MSE, student layer j to "
                        "teacher layer g(j)); 0 = KL to the teacher's probabilities only")


def ladder(*, student_layers=DEFAULT_LAYERS, fallback_targets=DEFAULT_TARGETS,
           fallback_rule="entropy", student_init="first", student_epochs=DEFAULT_EPOCHS,
           student_train_texts=DEFAULT_TRAIN_TEXTS, student_lr=DEFAULT_LR,
           student_hidden_weight=DEFAULT_HIDDEN_WEIGHT):
    """The variant configs of one sweep: layers × fallback targets (ValueError naming the flag)."""
    if not student_layers:
        raise ValueError("no student depth given; pass e.g. --student-layers 1 2 3")
    if not fallback_targets:
        raise ValueError("no fallback target given; pass e.g. --fallback-targets 0.99")
    out = [StudentConfig(layers=k, target=float(a), rule=fallback_rule, init=student_init,
                         epochs=student_epochs, train_texts=student_train_texts, lr=student_lr,
                         hidden_weight=student_hidden_weight)
           for k in dict.fromkeys(student_layers) for a in dict.fromkeys(fallback_targets)]
    return unique_by_name(out, {"layers": "--student-layers", "target": "--fallback-targets"})


def run_name(*, fallback_rule="entropy", **_):
    """Default run-folder suffix for these parameters."""
    return fallback_rule


def describe(info, timing=None):
    """Markdown lines: the student, its training curve, c, q, c + q, measured speed and p95."""
    tr = info["training"]
    lines = [f"- student: {info['student_layers']} of the teacher's {info['teacher_layers']} "
             f"layers (init `{info['init']}`: teacher layers {info['init_layers']}), trained "
             f"{tr['epochs']} epochs on {tr['n_train']} texts ({tr['source']}) in "
             f"{tr['train_s']:.1f} s" + (" (cached)" if info["student_cached"] else ""),
             f"- fallback: rule `{info['rule']}`, threshold {info['threshold']:.4g} fitted on "
             f"calibration to agreement {info['target']} (reached "
             f"{info['calibration_agreement']:.4f}, q = {info['calibration_q']:.3f}); student "
             f"alone agrees {info['calibration_student_agreement']:.4f}",
             "", "| epoch | distillation loss |", "|---:|---:|"]
    lines += [f"| {i} | {v:.5f} |" for i, v in enumerate(tr["curve"])]
    lines.append("")
    c = info["c"]
    ev = info.get("eval")
    if ev:
        lines.append(f"- eval: q = {ev['q']:.3f} ({ev['n_fallback']} of {ev['n']} to the "
                     f"teacher); cost model c + q = {c:.3f} + {ev['q']:.3f} = {c + ev['q']:.3f}"
                     f" → ideal speed-up {1 / (c + ev['q']):.2f}×")
    lines.append(f"- c = student / teacher forward time = {c:.3f} (measured, {info['c_note']})")
    for b, t in (timing or {}).get("batches", {}).items():
        v, r = t["var"], t["ref"]
        lines.append(f"- B={b} (L={t['seq_len']}): measured speed-up "
                     f"{t['speedup']['speedup_median']:.2f}×; mean {v['mean_ms']:.1f} ms, p95 "
                     f"{v['p95_ms']:.1f} ms vs teacher {r['mean_ms']:.1f} / {r['p95_ms']:.1f} ms "
                     + (f"({t['texts_cycled']} texts in turn, the same for the teacher: the "
                        "student's path or the fallback's as each text takes it)"
                        if t.get("texts_cycled") else
                        "(one text, repeated: either the student's path or the fallback's, "
                        "not the mix)" if str(b) == "1" else
                        "(a batch with any routed row pays the student plus a teacher pass on "
                        "those rows: with q well above 1/B nearly every batch does, so mean and "
                        "p95 sit near the teacher's)"))
    return "\n".join(lines) + "\n"


def outputs_info(info, outputs):
    """build.json additions from the variant's own outputs ({split: DecisionOutputs}): the eval
    fallback rate q from ``exit_layer`` (layers run per row: student depth, or student + teacher
    depth for a routed row)."""
    ev = outputs.get("eval")
    if ev is None or getattr(ev, "exit_layer", None) is None:
        return {}
    routed = ev.exit_layer > info["student_layers"]
    return {"eval": {"n": int(len(routed)), "n_fallback": int(routed.sum()),
                     "q": float(routed.mean()) if len(routed) else 0.0}}


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.student.build.build`."""
    from variants.families.student import build as student

    return student.build(reference, config, calibration=inputs.calibration, fit=inputs.fit,
                         cache_dir=inputs.cache_dir, mode=mode)


#: what a head that is not a softmax can use instead (:func:`check_model`)
FIX = ("choose --family quant (rtn, gptq or awq), lowrank, prune, w8a8 or exact, which the "
       "head's own contract judges")


def check_model(encoder, configs, model=None):
    """The family's model check: :func:`variants.families.student.build.check_model`."""
    from variants.families.student import build as student
    from variants.models.head_output import require_softmax

    require_softmax(model, "--family student distils by KL(teacher || student) between softmaxes "
                    "over the options and falls back on the student's softmax confidence", FIX)
    student.check_model(encoder, configs, model=model)


FAMILY = Family(name="student", config=StudentConfig, params=PARAMS,
                add_arguments=add_arguments, ladder=ladder, run_name=run_name, build=build,
                check_model=check_model, describe=describe,
                inputs=("calibration", "fit", "cache_dir"), outputs_info=outputs_info)
