"""Early exit: distilled decision heads after intermediate encoder layers, with a confidence rule.

After each chosen layer l (1 ≤ l < N) an intermediate head turns the mean-pooled, L2-normalised
hidden state into the model's logits (:mod:`variants.builders.exit_heads`):

- minilm-sentiment (a linear ``head``): a linear head to the K logits;
- minilm-choice (logit_k = 20·cos(text, option_k)): a linear map into the final embedding
  space, logits 20·cos(mapped, o_k) with the option embeddings o_k of the full encoder.

Each head is distilled on the **fit** split from the reference model's own output distribution
(FastBERT, Liu et al. 2020, §3.3: cross-entropy to the final head's softmax, i.e. KL up to a
constant), optionally mixed with the labels, by L-BFGS (SciPy); heads are cached keyed by the
reference's weights + fit data + config.

Exit rules (:mod:`variants.builders.exit_rules`), checked after each head in order, the final
layer always answering: normalised entropy below τ (DeeBERT, Xin et al. 2020), top-2 probability
margin above τ, patience — t consecutive heads agree (PABEE, Zhou et al. 2020). τ (or t) is
chosen on the **calibration** split only: the cheapest threshold (mean fraction of layers run)
whose calibration agreement with the reference's answers reaches ``target``; or fixed by
``threshold``. A rule that can never fire (entropy τ ≤ 0, margin τ ≥ 1, patience t > heads)
runs no head at all: the variant's forward is the reference's.

Batched execution shrinks the batch: rows that exit are removed (``x[keep]``) and the remaining
rows are cut to their longest real length, so later layers really see fewer rows; each forward
leaves the per-row exit layer in ``last_exit_layer`` (recorded by ``DecisionModel.outputs`` as
``DecisionOutputs.exit_layer``). Composes with quantization (``bits``): the encoder is
quantized, heads stay fp32.
"""

import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from variants.builders import name_number, realised_speed_lines, unique_by_name  # noqa: F401
from variants.builders.exit_heads import (FALLBACK_N_FIT, HEAD_L2, KINDS, cosine_logits,  # noqa: F401
                                          fit_cosine_head, fit_head, head_logits, ridge_map,
                                          split_features, trained_heads, unit)
from variants.builders.exit_rules import (N_CANDIDATES, RULES, exit_summary,  # noqa: F401
                                          fires, fit_threshold, never_fires, predictions,
                                          rule_statistic, simulate, summary_lines)
from variants.builders.quantize import (BITS, GROUP_SIZES, MODES, QuantConfig, check_bits,
                                        quantize_module)
from variants.encoder import attention_bias, mean_pool

DEFAULT_TARGETS = (0.99, 0.97)
NEAR_TIE_MARGIN = 1.0  # raw-logit margin of the reference below which an example is a near tie


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExitConfig:
    """Parameters of one early-exit variant (validated on creation).

    Exactly one of ``target`` (calibration agreement to reach; the threshold is fitted) and
    ``threshold`` (fixed τ, or t for patience) is set. ``exit_layers`` None = every layer 1..N−1.
    """

    rule: str = "entropy"
    target: float | None = 0.99
    threshold: float | None = None
    exit_layers: tuple | None = None
    label_mix: float = 0.0
    bits: int | None = None
    group_size: int = 64

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"exit rule {self.rule!r} is not known; choose one of {RULES} "
                             "(--exit-rules)")
        if (self.target is None) == (self.threshold is None):
            raise ValueError("give exactly one of exit_target (fit the threshold) and "
                             "exit_threshold (fixed), e.g. --exit-targets 0.99")
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"exit_target={self.target} is outside (0, 1]; it is the agreement "
                             "with the reference to reach on calibration, e.g. 0.99")
        if self.threshold is not None:
            t = self.threshold
            if not math.isfinite(t):
                raise ValueError(f"--exit-thresholds {t} is not a finite number; pass e.g. "
                                 "--exit-thresholds 0.3 (entropy/margin) or 2 (patience)")
            if self.rule == "entropy" and not 0 < t <= 1:
                raise ValueError(f"exit_threshold={t} for rule entropy is outside (0, 1]: no "
                                 "calibration example can have normalised entropy below it")
            if self.rule == "margin" and not 0 <= t < 1:
                raise ValueError(f"exit_threshold={t} for rule margin is outside [0, 1): no "
                                 "calibration example can have a top-2 margin above it")
            if self.rule == "patience" and (int(t) != t or t < 2):
                raise ValueError(f"exit_threshold={t} for rule patience must be an integer >= 2 "
                                 "(heads that must agree)")
        if self.exit_layers is not None and (
                not self.exit_layers or any(int(a) != a or a < 1 for a in self.exit_layers)
                or list(self.exit_layers) != sorted(set(self.exit_layers))):
            raise ValueError(f"exit_layers={self.exit_layers} must be increasing integers >= 1 "
                             "(and < number of layers)")
        if not 0 <= self.label_mix <= 1:
            raise ValueError(f"exit_label_mix={self.label_mix} is outside [0, 1]")
        check_bits(self.bits, self.group_size, "exit_")

    @property
    def name(self):
        # numbers as before (0.99 -> ag0.99, 0.3 -> t0.3, mix 0.3 -> mix0.30) unless that rounds
        # them: then the shortest exact form (0.1231 -> t0.1231), so names never collide
        if self.target is not None:
            s = f"exit-{self.rule}-ag{name_number(self.target, '.3g')}"
        elif self.rule == "patience":
            s = f"exit-patience-t{int(self.threshold)}"
        else:
            s = f"exit-{self.rule}-t{name_number(self.threshold, '.3g')}"
        if self.exit_layers is not None:
            s += "-h" + ".".join(str(int(a)) for a in self.exit_layers)
        if self.label_mix:
            s += f"-mix{name_number(self.label_mix, '.2f')}"
        if self.bits is not None:
            s += f"-q{self.bits}" + ("" if self.group_size == 64 else f"g{self.group_size}")
        return s


# ---------------------------------------------------------------------------------------------
# the early-exit forward pass
# ---------------------------------------------------------------------------------------------

class ExitNet(nn.Module):
    """Wraps a decision module with intermediate heads and an exit rule.

    Parameters
    ----------
    base : nn.Module
        ``kind='linear'``: a module with ``encoder`` and a linear ``head`` (SentimentNet);
        ``kind='cosine'``: an embedding net with ``encoder`` (choice.EmbeddingNet).
    heads : list of nn.Linear — one per layer of ``layers`` ((D → K) linear, (D → D) cosine)
    layers : sequence of int — 1-based layers after which a head runs
    rule, threshold : the exit rule (``exit_rules.RULES``) and its τ (or t)
    kind : {'linear', 'cosine'}
    temperatures : dict {K: T}, optional — cosine heads read p at the model's per-K temperature

    Linear kind: call like the wrapped module, (B, L) int32 ids, mask, types -> (B, K) logits.
    Cosine kind: :meth:`option_logits` (used by ``ChoiceModel.forward``) -> (B, K) logits;
    :meth:`embed_options` embeds option texts with the full ``base``. After each forward
    ``last_exit_layer`` (B,) int holds every row's exit layer (N = ran every layer) and
    ``heads_run`` the number of intermediate heads evaluated (0 when the rule can never fire).
    """

    def __init__(self, base, heads, layers, rule, threshold, kind="linear", temperatures=None):
        super().__init__()
        self.base = base
        self.exit_heads = list(heads)
        self._layers = tuple(int(a) for a in layers)
        self._rule = rule
        self._threshold = float(threshold)
        self._kind = kind
        self._temperatures = {int(k): float(v) for k, v in (temperatures or {}).items()}
        self._never = never_fires(rule, self._threshold, len(self._layers))
        self.last_exit_layer = None
        self.heads_run = 0

    def __call__(self, input_ids, attention_mask, token_type_ids):
        if self._kind == "cosine":  # an embedding net: the full embedding (no exit possible)
            self.last_exit_layer, self.heads_run = None, 0
            return self.base(input_ids, attention_mask, token_type_ids)
        return self.forward_trace(input_ids, attention_mask, token_type_ids)

    def embed_options(self, input_ids, attention_mask, token_type_ids):
        """(n, D) embeddings of option texts by the full ``base`` (no exit): computed once."""
        return self.base(input_ids, attention_mask, token_type_ids)

    def option_logits(self, input_ids, attention_mask, token_type_ids, options, option_valid):
        """Cosine kind: (B, K) logits 20·cos(text, option) with early exit; ``options`` (B, K, D)
        option embeddings, ``option_valid`` (B, K) bool."""
        return self.forward_trace(input_ids, attention_mask, token_type_ids, options=options,
                                  option_valid=option_valid)

    def _temperature(self, valid_np):
        k = valid_np.sum(1)
        missing = sorted(set(k.tolist()) - set(self._temperatures))
        if missing:
            raise ValueError(f"no temperature for option counts {missing}: calibrate the "
                             "reference before building the early-exit variant")
        return np.array([self._temperatures[int(x)] for x in k], np.float64)

    def _final(self, pooled, options, valid):
        if self._kind == "cosine":
            return cosine_logits(pooled, options, valid)
        return self.base.head(pooled)

    def forward_trace(self, input_ids, attention_mask, token_type_ids, trace=None, *,
                      options=None, option_valid=None):
        """As ``__call__`` / :meth:`option_logits`; appends ``(layer index, x.shape)`` for every
        layer's input to ``trace`` when a list is given (tests check the batch shrinks)."""
        enc = self.base.encoder
        n_layers = len(enc.layers)
        B = input_ids.shape[0]
        if self._kind == "cosine" and (options is None or option_valid is None):
            raise ValueError("cosine exit heads need options (B, K, D) and option_valid (B, K)")
        self.heads_run = 0
        if self._never:  # no head can fire: exactly the reference's forward
            self.last_exit_layer = np.full(B, n_layers, np.int64)
            if self._kind == "linear":
                return self.base(input_ids, attention_mask, token_type_ids)
            return cosine_logits(self.base(input_ids, attention_mask, token_type_ids), options,
                                 option_valid)
        x = enc.embed(input_ids, token_type_ids)
        mask = attention_mask
        bias = attention_bias(mask, x.dtype)
        heads = dict(zip(self._layers, self.exit_heads))
        valid_np = None if option_valid is None else np.array(option_valid, bool)
        temp = self._temperature(valid_np) if self._kind == "cosine" else None
        active = np.arange(B)
        out = None
        exit_layer = np.full(B, n_layers, np.int64)
        run = np.zeros(B, np.int64)
        prev = np.full(B, -1)
        for i, layer in enumerate(enc.layers):
            if trace is not None:
                trace.append((i, tuple(x.shape)))
            x = enc.run_layer(layer, x, bias, mask)  # packed like the reference if padded
            head = heads.get(i + 1)
            if head is None or i + 1 >= n_layers:
                continue
            z = head(mean_pool(x, mask))
            if self._kind == "cosine":
                z = cosine_logits(unit(z), options, option_valid)
            lg = np.array(z, np.float32)  # syncs: the exit is data-dependent
            self.heads_run += 1
            if out is None:
                out = np.zeros((B, lg.shape[1]), np.float32)
            pred = predictions(lg, valid_np)
            run = np.where(pred == prev, run + 1, 1)
            prev = pred
            s = run if self._rule == "patience" else rule_statistic(lg, self._rule, valid_np,
                                                                    temp)
            f = fires(s, self._rule, self._threshold)
            if not f.any():
                continue
            out[active[f]] = lg[f]
            exit_layer[active[f]] = i + 1
            keep = np.nonzero(~f)[0]
            active, run, prev = active[keep], run[keep], prev[keep]
            if len(active) == 0:
                self.last_exit_layer = exit_layer
                return mx.array(out)
            idx = mx.array(keep.astype(np.int32))
            mask = mask[idx]
            L = int(mask.sum(axis=1).max().item())  # right padding: cut to the longest left
            x, mask = x[idx][:, :L], mask[:, :L]
            bias = attention_bias(mask, x.dtype)
            if self._kind == "cosine":
                options, option_valid = options[idx], option_valid[idx]
                valid_np, temp = valid_np[keep], temp[keep]
        final = self._final(mean_pool(x, mask), options, option_valid)
        self.last_exit_layer = exit_layer
        if out is None:
            return final
        out[active] = np.array(final, np.float32)
        return mx.array(out)


# ---------------------------------------------------------------------------------------------
# the family's registry interface
# ---------------------------------------------------------------------------------------------

PARAMS = ("exit_rules", "exit_targets", "exit_thresholds", "exit_layers", "exit_label_mix",
          "exit_bits", "exit_group_size")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("exit family (--family exit)")
    g.add_argument("--exit-rules", nargs="+", choices=RULES, default=list(RULES),
                   help="entropy (DeeBERT), margin (top-2 probability), patience (PABEE)")
    g.add_argument("--exit-targets", type=float, nargs="+", default=None, metavar="A",
                   help="calibration agreement with the reference each fitted threshold must "
                        "reach; not with --exit-thresholds; when neither is given: "
                        + " ".join(map(str, DEFAULT_TARGETS)))
    g.add_argument("--exit-thresholds", type=float, nargs="+", default=None, metavar="T",
                   help="fixed thresholds instead of --exit-targets (entropy: τ in (0, 1]; "
                        "margin: τ in [0, 1); patience: t >= 2 heads)")
    g.add_argument("--exit-layers", type=int, nargs="+", default=None, metavar="L",
                   help="layers with an exit head (default: every layer 1..N-1)")
    g.add_argument("--exit-label-mix", type=float, default=0.0,
                   help="weight of the labels in the head loss (0 = pure distillation)")
    g.add_argument("--exit-bits", type=int, nargs="+", default=None, metavar="B",
                   help=f"also quantize the encoder with these bit widths {BITS}")
    g.add_argument("--exit-group-size", type=int, default=64, choices=GROUP_SIZES,
                   help="group size when --exit-bits is given")


def ladder(*, exit_rules=RULES, exit_targets=None, exit_thresholds=None,
           exit_layers=None, exit_label_mix=0.0, exit_bits=None, exit_group_size=64):
    """The variant configs of one sweep: rule × (targets or thresholds) × bits.

    ``exit_targets`` None = ``DEFAULT_TARGETS`` unless ``exit_thresholds`` are given; giving
    both is refused (one would be ignored).

    Raises
    ------
    ValueError
        Naming the parameter and the fix.
    """
    if not exit_rules:
        raise ValueError("no exit rule given; pass e.g. --exit-rules entropy")
    if exit_thresholds is not None and exit_targets is not None:
        raise ValueError("--exit-targets and --exit-thresholds were both given: pass one or the "
                         "other (--exit-targets fits each threshold on calibration to reach that "
                         "agreement, --exit-thresholds fixes it)")
    if exit_thresholds is not None and not len(exit_thresholds):
        raise ValueError("no thresholds given; pass e.g. --exit-thresholds 0.3")
    if exit_thresholds is None and exit_targets is None:
        exit_targets = DEFAULT_TARGETS
    if exit_thresholds is None and not len(exit_targets):
        raise ValueError("no targets given; pass e.g. --exit-targets 0.99")
    values = ([dict(threshold=float(t), target=None) for t in exit_thresholds]
              if exit_thresholds is not None else [dict(target=float(a)) for a in exit_targets])
    layers = tuple(int(a) for a in exit_layers) if exit_layers else None
    rules = list(dict.fromkeys(exit_rules))
    out = []
    for rule in rules:
        for v in values:
            for b in (exit_bits or [None]):
                try:
                    out.append(ExitConfig(rule=rule, exit_layers=layers,
                                          label_mix=exit_label_mix, bits=b,
                                          group_size=exit_group_size, **v))
                except ValueError as e:
                    if "threshold" in v and "patience" in rules and len(rules) > 1:
                        raise ValueError(f"{e}; {_mixed_patience_hint(rules)}") from None
                    raise
    return unique_by_name(out, {"rule": "--exit-rules", "target": "--exit-targets",
                                "threshold": "--exit-thresholds",
                                "exit_layers": "--exit-layers",
                                "label_mix": "--exit-label-mix", "bits": "--exit-bits",
                                "group_size": "--exit-group-size"})


def _mixed_patience_hint(rules):
    """Fixed thresholds go to every rule, but patience counts heads (t >= 2) while entropy and
    margin take τ in (0, 1] / [0, 1): no threshold suits both, so say which rules to pass."""
    others = " ".join(r for r in rules if r != "patience")
    default = " (by default: " + " ".join(RULES) + ")" if sorted(rules) == sorted(RULES) else ""
    return (f"rule patience is among the --exit-rules{default}, and fixed thresholds go to "
            f"every rule: patience needs an integer t >= 2, {others} a τ between 0 and 1; pass "
            f"--exit-rules {others} for τ thresholds (or sweep --exit-rules patience "
            "--exit-thresholds 2 on its own)")


def run_name(*, exit_thresholds=None, exit_bits=None, **_):
    """Default run-folder suffix for these parameters."""
    return ("fixed" if exit_thresholds else "target") + (
        "" if not exit_bits else "-q" + "-".join(map(str, exit_bits)))


def _layers_of(cfg, n_layers):
    return tuple(cfg.exit_layers) if cfg.exit_layers else tuple(range(1, n_layers))


def _kind_of_model_name(model):
    """Head kind of a registered model name (``EXIT_HEAD_KIND`` of its model file) or None."""
    from variants.models import get_module

    return getattr(get_module(model), "EXIT_HEAD_KIND", None)


def check_model(module, cfgs, model=None):
    """Reject, before a sweep writes anything: a decision model early exit cannot reproduce
    (``model`` = the registry name; its model file must define ``EXIT_HEAD_KIND``), an encoder
    without per-layer access, exit layers outside [1, N), and fixed thresholds that no
    calibration example can meet (a patience longer than the number of heads; entropy τ ≤ 0 and
    margin τ ≥ 1 are already refused by :class:`ExitConfig`). ``module``: the encoder.

    Raises
    ------
    ValueError
        Naming the parameter (--model, --exit-layers, --exit-thresholds) and the fix.
    """
    if model is not None and _kind_of_model_name(model) not in KINDS:
        raise ValueError(f"--model {model} has no early-exit head (its model file defines no "
                         f"EXIT_HEAD_KIND in {KINDS}); early exit supports minilm-sentiment "
                         "and minilm-choice: choose --family prune or quant for it")
    layers = getattr(module, "layers", None)
    if layers is None:
        raise ValueError(f"--model {model or '?'}: its encoder {type(module).__name__} has no "
                         "per-layer access (a `layers` list); --family exit needs one")
    n = len(layers)
    for cfg in cfgs:
        ls = _layers_of(cfg, n)
        bad = [a for a in ls if not 1 <= a < n]
        if bad:
            raise ValueError(f"exit_layers {bad} are outside [1, {n}) for this {n}-layer encoder"
                             f" (--exit-layers takes layers 1..{n - 1})")
        if cfg.threshold is not None and cfg.rule == "patience" and len(ls) < 2:
            raise ValueError(f"rule patience needs at least 2 exit heads (t >= 2 consecutive "
                             f"heads must agree) but --exit-layers {' '.join(map(str, ls))} "
                             f"gives {len(ls)}; pass two or more, e.g. --exit-layers "
                             f"{' '.join(map(str, range(1, min(n, 3))))}, or leave "
                             f"--exit-layers out for every layer 1..{n - 1}")
        if cfg.threshold is not None and never_fires(cfg.rule, cfg.threshold, len(ls)):
            what = (f"exceeds the {len(ls)} exit heads" if cfg.rule == "patience"
                    else "is never reached")
            raise ValueError(f"exit_threshold={cfg.threshold:g} for rule {cfg.rule} {what}: no "
                             "calibration example can meet it; pass --exit-thresholds "
                             + ("t in 2..%d" % len(ls) if cfg.rule == "patience" else
                                "in (0, 1]" if cfg.rule == "entropy" else "in [0, 1)")
                             + " or --exit-targets to fit it")


def _head_kind(reference):
    """'linear' (module with encoder + linear head), 'cosine' (ChoiceModel) or an error."""
    module = reference.module
    if "encoder" not in module or not hasattr(module["encoder"], "layers"):
        raise ValueError(f"--model {reference.name}: {type(module).__name__} has no per-layer "
                         "access (module.encoder.layers); --family exit needs one")
    kind = getattr(reference, "exit_head_kind", None)
    if kind == "linear" and "head" in module and isinstance(module["head"], nn.Linear):
        return kind
    if kind == "cosine":
        return kind
    raise ValueError(f"--model {reference.name} ({type(module).__name__}) has no early-exit "
                     f"head kind (exit_head_kind in {KINDS} with a linear head for 'linear'): "
                     "choose --family prune or quant for it")


# "calibration key" = reference.cache_key(calibration fingerprint): + config, tokenizer settings
_FEATS = OrderedDict()  # (id(module), calibration key, layers, kind) -> features
_MEMO = OrderedDict()  # (id(module), cfg without mode, calibration key) -> fitted state


def build(reference, cfg, mode="simulated", calibration=None, *, cache_dir=None, fit=None):
    """Registry entry: the reference DecisionModel with distilled exit heads and a fitted rule.

    Parameters
    ----------
    reference : DecisionModel (calibrated: its temperatures are used by cosine heads)
        minilm-sentiment (``module.encoder`` with ``layers`` and a linear ``head``) or
        minilm-choice (``module`` an embedding net with ``encoder.layers``).
    cfg : ExitConfig
    mode : {'native', 'simulated'}, default='simulated'
        Meaningful only with ``cfg.bits``.
    calibration : TaskSet
        Thresholds are chosen on it (never on eval); required.
    cache_dir : path, optional
        Trained heads are cached in ``cache_dir/exit_heads/``.
    fit : TaskSet, optional
        The fit split the heads are distilled on (default: drawn here, see ``fit_source``).

    Returns
    -------
    variant : DecisionModel
    info : dict
        ``rule``, ``threshold``, ``target``, ``exit_layers``, ``head_kind``,
        ``calibration_agreement``, ``expected_cost`` (mean fraction of layers run on
        calibration), ``work_ratio``, ``ideal_speedup`` = 1 / expected cost, ``exit_histogram``
        (calibration, layer -> count), ``near_tie_mean_exit_layer`` / ``other_mean_exit_layer``,
        ``never_fires`` (no head runs), head training facts, ``model_bytes`` (the encoder as
        stored — quantized with ``cfg.bits`` — plus the fp32 exit heads, i.e. every parameter of
        the variant module in native form) and ``exit_head_bytes`` (the heads' share).

    Raises
    ------
    ValueError
        Unknown mode, a module without per-layer access or without an exit head kind, no
        calibration split, a fixed threshold no calibration example meets.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    kind = _head_kind(reference)
    module = reference.module
    if calibration is None:
        raise ValueError("early exit needs the calibration split to choose its threshold "
                         "(build(reference, cfg, calibration=...))")
    n_layers = len(module.encoder.layers)
    check_model(module.encoder, [cfg])
    layers = _layers_of(cfg, n_layers)
    base, qinfo = module, None
    if cfg.bits is not None:
        base, qinfo = quantize_module(module, QuantConfig(cfg.bits, cfg.group_size), mode)
    cal_key = reference.cache_key(calibration.fingerprint())
    key = (id(module), cfg, cal_key)
    state = _MEMO.get(key)
    if state is None or state[0] is not module:
        heads, hinfo = trained_heads(reference, layers, cfg.label_mix, fit=fit,
                                     cache_dir=cache_dir, kind=kind)
        qsim = base if cfg.bits is None or mode == "simulated" else quantize_module(
            module, QuantConfig(cfg.bits, cfg.group_size), "simulated")[0]
        fkey = (id(qsim), cal_key, layers, kind)
        hit = _FEATS.get(fkey)
        if hit is not None and hit[0] is qsim:
            cal = hit[1]
        else:
            cal = split_features(reference, qsim, calibration, layers, kind)
            _FEATS[fkey] = (qsim, cal)
            while len(_FEATS) > 2:
                _FEATS.popitem(last=False)
        mask, temp, final_logits = cal["mask"], cal["temperature"], cal["logits"]
        ref_logits = final_logits if qsim is module else split_features(
            reference, module, calibration, [], kind)["logits"]
        ref_pred = predictions(ref_logits, mask)
        hl = [head_logits(kind, h, cal["feats"][l], cal["opts"], mask)
              for l, h in zip(layers, heads)]
        target_met = None
        if cfg.target is not None:
            threshold, agree, cost = fit_threshold(hl, final_logits, ref_pred, cfg.rule,
                                                   cfg.target, layers, n_layers, mask, temp)
            target_met = agree >= cfg.target
            if not target_met:
                warnings.warn(
                    f"exit target agreement {cfg.target} is out of reach on calibration: the best "
                    f"threshold ({cfg.rule} {threshold:g}) agrees {agree:.4f} with the reference "
                    f"(a {cfg.bits}-bit base disagrees on its own); kept that threshold — lower "
                    "--exit-targets or raise --exit-bits", stacklevel=2)
        else:
            threshold = cfg.threshold
        el, lg = simulate(hl, final_logits, cfg.rule, threshold, layers, n_layers, mask, temp)
        if cfg.threshold is not None and not (el < n_layers).any():
            raise ValueError(f"exit_threshold={cfg.threshold} ({cfg.rule}) fires on none of the "
                             f"{len(el)} calibration examples: the variant would be the reference"
                             "; pass a looser threshold")
        agree = float((predictions(lg, mask) == ref_pred).mean())
        summ = exit_summary(el, n_layers, ref_logits, mask, NEAR_TIE_MARGIN, layers)
        never = never_fires(cfg.rule, threshold, len(layers))
        info = {"rule": cfg.rule, "target": cfg.target, "threshold": float(threshold),
                "threshold_fitted_on": "calibration" if cfg.target is not None else "fixed",
                "target_met_on_calibration": target_met,
                "exit_layers": list(layers), "n_layers": n_layers, "label_mix": cfg.label_mix,
                "head_kind": kind, "never_fires": bool(never),
                "rule_probabilities": ("softmax(raw logits)" if temp is None else
                                       "softmax(logits / the model's per-K temperature)"),
                "calibration_agreement": agree, "n_calibration": len(el),
                "expected_cost": summ["expected_cost"],
                "exit_histogram": summ["exit_histogram"],
                "exited_early_share": summ["exited_early_share"],
                **{k: summ[k] for k in ("near_tie_margin", "n_near_tie",
                                        "near_tie_mean_exit_layer", "other_mean_exit_layer",
                                        "near_tie_ran_all_share", "other_ran_all_share")},
                **hinfo}
        info["work_ratio"] = info["expected_cost"]
        info["ideal_speedup"] = 1.0 / info["expected_cost"]
        info["ideal_speedup_note"] = ("1 / mean fraction of encoder layers run on the "
                                      "calibration split (heads, pooling, syncs ignored)")
        state = (module, heads, threshold, info)
        _MEMO[key] = state
        while len(_MEMO) > 4:
            _MEMO.popitem(last=False)
    _, heads, threshold, info = state
    info = dict(info)
    mlx_heads = []
    for w, b in heads:
        h = nn.Linear(w.shape[1], w.shape[0])
        h.weight, h.bias = mx.array(w), mx.array(b)
        mlx_heads.append(h)
    wrapper = ExitNet(base, mlx_heads, layers, cfg.rule, threshold, kind=kind,
                      temperatures=reference.temperatures)
    # model_bytes: everything the variant stores — the (quantized) base, the fp32 exit heads and
    # any parameter of the wrapper itself (= the wrapper's parameter bytes in native form)
    extra_bytes = int(sum(v.nbytes for k, v in tree_flatten(wrapper.parameters())
                          if not k.startswith("base.")))
    info.update(exit_head_bytes=extra_bytes)
    if qinfo is not None:
        info.update(quant=qinfo, bits_per_weight=qinfo["bits_per_weight"],
                    bits_per_weight_note="bits per quantized weight (exit heads stay fp32)",
                    model_bytes=qinfo["model_bytes"] + extra_bytes)
    else:
        info.update(bits_per_weight=32.0, bits_per_weight_note="fp32 weights (not quantized)",
                    model_bytes=int(sum(v.nbytes for _, v in
                                        tree_flatten(wrapper.parameters()))))
    return reference.replace_module(wrapper), info


def describe(info, timing=None, eval_summary=None):
    """Markdown lines: threshold, calibration exit histogram and cost, near ties, speed; with
    ``eval_summary`` (an :func:`exit_rules.exit_summary` dict of the eval split, or
    ``info['eval_exit']`` when present) the eval-split histogram, cost and near ties too. (The
    sweep calls ``describe(build.json, timing.json)``; the eval lines of a finished run are also
    written by :func:`variants.plots.exit_markdown` from the saved ``exit_layer`` arrays.)"""
    thr = info["threshold"]
    lines = [f"- rule `{info['rule']}`, threshold {thr:.4g} ({info['threshold_fitted_on']}"
             + (f", target agreement {info['target']}" if info.get("target") else "") + "); "
             f"{info.get('head_kind', 'linear')} heads after layers {info['exit_layers']} "
             f"({info['fit_source']})"
             + ("; the rule can never fire: no head runs" if info.get("never_fires") else ""),
             f"- calibration: agreement {info['calibration_agreement']:.4f}"]
    # build.json keeps the calibration exit_summary's fields at its top level
    lines += summary_lines({**info, "n": info["n_calibration"]}, "calibration")
    ev = eval_summary if eval_summary is not None else info.get("eval_exit")
    if ev:
        lines += summary_lines(ev, "eval")
    lines += realised_speed_lines(timing, info["ideal_speedup"])
    return "\n".join(lines) + "\n"
