"""Early exit: distilled decision heads after intermediate encoder layers, with a confidence rule.

After each chosen layer l (1 ≤ l < N) an intermediate head turns the mean-pooled, L2-normalised
hidden state into the model's logits (:mod:`variants.families.exit.heads`):

- minilm-sentiment (a linear ``head``): a linear head to the K logits;
- minilm-choice (logit_k = 20·cos(text, option_k)): a linear map into the final embedding
  space, logits 20·cos(mapped, o_k) with the option embeddings o_k of the full encoder.

Each head is distilled on the **fit** split from the reference model's own output distribution
(FastBERT, Liu et al. 2020, §3.3: cross-entropy to the final head's softmax, i.e. KL up to a
constant), optionally mixed with the labels, by L-BFGS (SciPy); heads are cached keyed by the
reference's weights + fit data + config.

Exit rules (:mod:`variants.families.exit.rules`), checked after each head in order, the final
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

import warnings
from collections import OrderedDict

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from metrics.defaults import NEAR_TIE_MARGIN
from variants.families.exit.heads import (FALLBACK_N_FIT, HEAD_L2, KINDS, cosine_logits,
                                          fit_cosine_head, fit_head, head_logits, ridge_map,
                                          split_features, trained_heads, unit)
from variants.families.exit.rules import (N_CANDIDATES, RULES, exit_summary, fires, fit_threshold,
                                          never_fires, predictions, rule_statistic, simulate,
                                          summary_lines)
from variants.families.quant.build import MODES, QuantConfig, quantize_module
from variants.families.exit.net import ExitNet
from variants.families.readout import check_readout


def _layers_of(cfg, n_layers):
    return tuple(cfg.exit_layers) if cfg.exit_layers else tuple(range(1, n_layers))


def _kind_of_model_name(model):
    """Head kind of a model: a :class:`variants.models.configured.ModelSource`'s own
    ``EXIT_HEAD_KIND``, or a registered name's model file's; ``...`` when unknown here (the
    decision module is then checked by :func:`_head_kind` at build)."""
    kind = getattr(model, "EXIT_HEAD_KIND", ...)
    if kind is not ... or not isinstance(model, str):
        return kind
    from variants.models import MODELS, get_module

    if model not in MODELS:
        return ...
    return getattr(get_module(model), "EXIT_HEAD_KIND", None)


def check_model(module, cfgs, model=None):
    """Reject, before a sweep writes anything: a decision model early exit cannot reproduce
    (``model`` = the registry name; its model file must define ``EXIT_HEAD_KIND``), an encoder
    without per-layer access, a decision module without a plain ``readout(last_hidden, mask)``
    (e.g. one reading marker-token positions), exit layers outside [1, N), and fixed thresholds
    that no calibration example can meet (a patience longer than the number of heads; entropy
    τ ≤ 0 and margin τ ≥ 1 are already refused by :class:`ExitConfig`). ``module``: the encoder,
    or the decision module (``encoder`` + ``readout``).

    Raises
    ------
    ValueError
        Naming the parameter (--model, --exit-layers, --exit-thresholds) and the fix.
    """
    kind = _kind_of_model_name(model) if model is not None else ...
    if kind is not ... and kind not in KINDS:
        raise ValueError(f"model {model} has no early-exit head kind (one of {KINDS}): early "
                         "exit reproduces linear-head, classifier and cosine (scale 20) models, "
                         "not marker or factory ones; choose --family quant, lowrank or prune")
    layers = getattr(module, "layers", None)
    if layers is None and getattr(module, "encoder", None) is not None:
        check_readout(module, "exit")
        layers = module.encoder.layers
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
    """'linear' (exit heads predict the module's logits: ``readout`` gives (B, K) logits) or
    'cosine' (ChoiceModel: ``readout`` gives the embedding scored against option texts), from
    ``reference.exit_head_kind``; an error naming why for anything else."""
    module = reference.module
    try:
        check_readout(module, "exit")
    except ValueError as e:
        raise ValueError(f"--model {reference.name}: {e}") from None
    kind = getattr(reference, "exit_head_kind", None)
    if kind in KINDS:
        return kind
    raise ValueError(f"--model {reference.name} ({type(reference).__name__}) has no early-exit "
                     f"head kind (exit_head_kind in {KINDS}: 'linear' when its readout gives "
                     "logits): choose --family prune or quant for it")


# "calibration key" = reference.cache_key(calibration fingerprint): + config, tokenizer settings
_FEATS = OrderedDict()  # (id(module), calibration key, layers, kind) -> features
_MEMO = OrderedDict()  # (id(module), cfg without mode, calibration key) -> fitted state


def build(reference, cfg, mode="simulated", calibration=None, *, cache_dir=None, fit=None):
    """Registry entry: the reference DecisionModel with distilled exit heads and a fitted rule.

    Parameters
    ----------
    reference : DecisionModel (calibrated: its temperatures are used by cosine heads)
        Its ``module`` has an ``encoder`` with the per-layer interface (any architecture) and a
        ``readout`` (:mod:`variants.families.readout`); ``exit_head_kind`` 'linear' (readout
        gives logits: minilm-sentiment, a checkpoint's classifier) or 'cosine' (minilm-choice).
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
    check_model(module, [cfg])
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
        # a batch whose rows all leave at the earliest exit: the most any call can gain
        info["max_speedup"] = info["n_layers"] / min(info["exit_layers"])
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
