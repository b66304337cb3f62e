"""Early exit: distilled decision heads after intermediate encoder layers, with a confidence rule.

After each chosen layer l (1 ≤ l < N) a linear head maps the mean-pooled, L2-normalised hidden
state to K logits. It is distilled from the reference model's own output distribution
(FastBERT, Liu et al. 2020, §3.3: cross-entropy to the final head's softmax, i.e. KL up to a
constant), optionally mixed with the labels (``label_mix`` λ: (1 − λ)·KL + λ·CE(label)), on the
**fit** split; L2-regularised and solved by L-BFGS (SciPy, as scikit-learn's LogisticRegression
does: the loss is convex). Heads are cached keyed by the reference's weights + fit data + config.

Exit rules, checked after each head in order (the final layer always answers):

- ``entropy``: normalised entropy H(p)/log K below τ (DeeBERT, Xin et al. 2020, §2.2);
- ``margin``: top-2 probability margin p₁ − p₂ above τ;
- ``patience``: the last t heads agree on the argmax (PABEE, Zhou et al. 2020, §3.2; PABEE's
  patience p is t = p + 1 here).

p = softmax of the head's raw logits. τ (or t) is chosen on the **calibration** split only: the
cheapest threshold (mean fraction of layers run) whose calibration agreement with the reference's
answers reaches ``target``; or fixed by ``threshold``.

Batched execution shrinks the batch: rows that exit are removed (``x[keep]``) and the remaining
rows are cut to their longest real length, so later layers really see fewer rows. Supported
for decision modules with a linear ``head`` (minilm-sentiment); minilm-choice is refused.
Composes with quantization (``bits``): the encoder is quantized, heads stay fp32.
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from scipy.optimize import minimize

from variants.builders import realised_speed_lines
from variants.builders.quantize import BITS, GROUP_SIZES, MODES, QuantConfig, quantize_module
from variants.encoder import attention_bias, mean_pool
from variants.io import digest, write_npz

RULES = ("entropy", "margin", "patience")
DEFAULT_TARGETS = (0.99, 0.97)
HEAD_L2 = 1e-3  # L2 strength on head weights (per example)
FALLBACK_N_FIT = 1000  # fit examples drawn by the builder when the sweep passes no fit split
NEAR_TIE_MARGIN = 1.0  # raw-logit margin of the reference below which an example is a near tie
N_CANDIDATES = 400  # thresholds tried per rule on the calibration split


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
        if self.bits is not None and self.bits not in BITS:
            raise ValueError(f"exit_bits={self.bits} is not supported; choose one of {BITS}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"exit_group_size={self.group_size} is not supported; choose one "
                             f"of {GROUP_SIZES}")

    @property
    def name(self):
        if self.target is not None:
            s = f"exit-{self.rule}-ag{self.target:.3g}"
        elif self.rule == "patience":
            s = f"exit-patience-t{int(self.threshold)}"
        else:
            s = f"exit-{self.rule}-t{self.threshold:.3g}"
        if self.exit_layers is not None:
            s += "-h" + ".".join(str(int(a)) for a in self.exit_layers)
        if self.label_mix:
            s += f"-mix{self.label_mix:.2f}"
        if self.bits is not None:
            s += f"-q{self.bits}" + ("" if self.group_size == 64 else f"g{self.group_size}")
        return s


# ---------------------------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------------------------

def _softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def rule_statistic(logits, rule):
    """Per-example statistic of a head's raw logits (n, K): normalised entropy (entropy) or top-2
    probability margin (margin); ``exit`` when entropy < τ, margin > τ."""
    p = _softmax(np.asarray(logits, np.float64))
    if rule == "entropy":
        return -(p * np.log(np.clip(p, 1e-30, 1))).sum(-1) / np.log(p.shape[-1])
    if rule == "margin":
        top = np.sort(p, axis=-1)
        return top[:, -1] - top[:, -2]
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


def simulate(head_logits, final_logits, rule, threshold, layers, n_layers):
    """Exit layer and answer of each example given every head's logits (no model run).

    Parameters
    ----------
    head_logits : list of ndarray (n, K), one per exit layer in ``layers``
    final_logits : ndarray (n, K)
        The model's own final head (the variant's answer when no rule fires).

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
        pred = lg.argmax(-1)
        run = np.where(pred == prev, run + 1, 1)
        prev = pred
        s = run if rule == "patience" else rule_statistic(lg, rule)
        f = fires(s, rule, threshold) & ~done
        exit_layer[f] = l
        out[f] = lg[f]
        done |= f
    return exit_layer, out


def fit_threshold(head_logits, final_logits, ref_pred, rule, target, layers, n_layers):
    """The cheapest threshold whose agreement with ``ref_pred`` reaches ``target``.

    Candidates: quantiles of the rule statistic over all heads (entropy, margin), or t = 2..H
    (patience); plus one that never fires. Returns ``(threshold, agreement, expected cost)``.
    """
    if rule == "patience":
        cands = [float(t) for t in range(2, len(layers) + 1)] + [float(len(layers) + 1)]
    else:
        stats = np.concatenate([rule_statistic(lg, rule) for lg in head_logits])
        qs = np.unique(np.quantile(stats, np.linspace(0, 1, N_CANDIDATES)))
        never = 0.0 if rule == "entropy" else 1.0
        cands = [never] + (qs.tolist() if rule == "entropy" else qs[::-1].tolist())
    best = None
    for t in cands:
        el, lg = simulate(head_logits, final_logits, rule, t, layers, n_layers)
        agree = float((lg.argmax(-1) == ref_pred).mean())
        cost = float(el.mean() / n_layers)
        if agree >= target and (best is None or cost < best[2] - 1e-12):
            best = (float(t), agree, cost)
    return best


# ---------------------------------------------------------------------------------------------
# the early-exit forward pass
# ---------------------------------------------------------------------------------------------

class ExitNet(nn.Module):
    """Wraps a decision module (``encoder`` + ``head``) with intermediate heads and an exit rule.

    Call like the wrapped module: (B, L) int32 ids, mask, types -> (B, K) logits. After each
    call ``last_exit_layer`` (B,) int holds every row's exit layer (N = ran every layer).
    """

    def __init__(self, base, heads, layers, rule, threshold):
        super().__init__()
        self.base = base
        self.exit_heads = list(heads)
        self._layers = tuple(int(a) for a in layers)
        self._rule = rule
        self._threshold = float(threshold)
        self.last_exit_layer = None

    def __call__(self, input_ids, attention_mask, token_type_ids):
        return self.forward_trace(input_ids, attention_mask, token_type_ids)

    def forward_trace(self, input_ids, attention_mask, token_type_ids, trace=None):
        """As ``__call__``; appends ``(layer index, x.shape)`` for every layer's input to
        ``trace`` when a list is given (tests check the batch shrinks)."""
        enc = self.base.encoder
        n_layers = len(enc.layers)
        B = input_ids.shape[0]
        x = enc.embed(input_ids, token_type_ids)
        mask = attention_mask
        bias = attention_bias(mask, x.dtype)
        heads = dict(zip(self._layers, self.exit_heads))
        active = np.arange(B)
        out = None
        exit_layer = np.full(B, n_layers, np.int64)
        run = np.zeros(B, np.int64)
        prev = np.full(B, -1)
        for i, layer in enumerate(enc.layers):
            if trace is not None:
                trace.append((i, tuple(x.shape)))
            x, _ = layer(x, bias)
            head = heads.get(i + 1)
            if head is None or i + 1 >= n_layers:
                continue
            lg = np.array(head(mean_pool(x, mask)), np.float32)  # syncs: the exit is data-dependent
            if out is None:
                out = np.zeros((B, lg.shape[1]), np.float32)
            pred = lg.argmax(-1)
            run = np.where(pred == prev, run + 1, 1)
            prev = pred
            s = run if self._rule == "patience" else rule_statistic(lg, self._rule)
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
        final = self.base.head(mean_pool(x, mask))
        self.last_exit_layer = exit_layer
        if out is None:
            return final
        out[active] = np.array(final, np.float32)
        return mx.array(out)


# ---------------------------------------------------------------------------------------------
# training the heads
# ---------------------------------------------------------------------------------------------

def layer_features(module, batches, layers):
    """Mean-pooled normalised hidden states after each layer in ``layers`` and the final raw
    logits, for prepared ``batches``. Returns ({layer: (n, D)}, (n, K), order (n,))."""
    feats = {l: [] for l in layers}
    logits, order = [], []
    for b in batches:
        enc = module.encoder(b.input_ids, b.attention_mask, b.token_type_ids,
                             output_hidden_states=True)
        for l in layers:
            feats[l].append(np.array(mean_pool(enc.hidden_states[l], b.attention_mask)))
        logits.append(np.array(module.head(mean_pool(enc.last_hidden, b.attention_mask))))
        order.append(b.index)
    order = np.concatenate(order)
    inv = np.argsort(order)
    return ({l: np.concatenate(v)[inv] for l, v in feats.items()},
            np.concatenate(logits)[inv].astype(np.float64), order[inv])


def fit_head(features, soft_targets, labels=None, *, label_mix=0.0, l2=HEAD_L2):
    """Distil one linear head: min (1 − λ)·CE(soft, q) + λ·CE(label, q) + l2/2·‖W‖² by L-BFGS.

    Parameters
    ----------
    features : ndarray (n, D)
    soft_targets : ndarray (n, K) — the reference's probabilities (rows sum to 1)
    labels : ndarray (n,) int, optional (−1 = unlabeled); needed when ``label_mix`` > 0

    Returns
    -------
    weight : ndarray (K, D) float32, bias : ndarray (K,) float32
    """
    X = np.asarray(features, np.float64)
    n, D = X.shape
    K = soft_targets.shape[1]
    T = np.asarray(soft_targets, np.float64)
    if label_mix > 0:
        Y = np.zeros_like(T)
        ok = labels >= 0
        Y[ok, labels[ok]] = 1.0
        T = np.where(ok[:, None], (1 - label_mix) * T + label_mix * Y, T)

    def loss(theta):
        W, b = theta[:K * D].reshape(K, D), theta[K * D:]
        z = X @ W.T + b
        z -= z.max(1, keepdims=True)
        logq = z - np.log(np.exp(z).sum(1, keepdims=True))
        f = -(T * logq).sum() / n + 0.5 * l2 * (W ** 2).sum()
        g = (np.exp(logq) - T) / n
        return f, np.concatenate([(g.T @ X + l2 * W).ravel(), g.sum(0)])

    res = minimize(loss, np.zeros(K * D + K), jac=True, method="L-BFGS-B",
                   options={"maxiter": 1000})
    return (res.x[:K * D].reshape(K, D).astype(np.float32), res.x[K * D:].astype(np.float32))


def _module_digest(module):
    h = hashlib.sha256()
    for k, v in tree_flatten(module.parameters()):
        h.update(k.encode())
        h.update(np.asarray(v).tobytes())
    return h.hexdigest()[:16]


def _fit_split(reference, fit):
    if fit is not None:
        return fit, f"fit split passed by the sweep ({len(fit)} examples)"
    from variants import data
    from variants.models import get_module

    frame = data.sample(data.split_frame(data.load_vader(), "fit"), FALLBACK_N_FIT, seed=0)
    return (get_module(reference.name).make_taskset(frame),
            f"fit split drawn by the builder ({FALLBACK_N_FIT} examples, seed 0): the sweep "
            "passed no fit TaskSet")


def trained_heads(reference, layers, label_mix, fit=None, cache_dir=None):
    """Heads for ``layers`` (list of (W, b)), trained on the fit split or loaded from the cache
    (key: reference weights + fit data + layers + label mix + L2). Returns (heads, info)."""
    fit, source = _fit_split(reference, fit)
    key = digest(_module_digest(reference.module), fit.fingerprint(), list(layers), label_mix,
                 HEAD_L2, "fastbert-kl-v1")
    path = None if cache_dir is None else cache_dir / "exit_heads" / f"{reference.name}-{key}.npz"
    info = {"fit_source": source, "heads_cache_key": key, "n_fit": len(fit)}
    if path is not None and path.exists():
        with np.load(path) as z:
            return [(z[f"w{l}"], z[f"b{l}"]) for l in layers], {**info, "heads_cached": True}
    batches, _ = reference.prepare(fit)
    feats, logits, _ = layer_features(reference.module, batches, layers)
    soft = _softmax(logits)
    heads = [fit_head(feats[l], soft, np.asarray(fit.labels), label_mix=label_mix) for l in layers]
    fit_agree = {int(l): float(((feats[l] @ w.T + b).argmax(1) == logits.argmax(1)).mean())
                 for l, (w, b) in zip(layers, heads)}
    if path is not None:
        write_npz(path, {**{f"w{l}": w for l, (w, _) in zip(layers, heads)},
                         **{f"b{l}": b for l, (_, b) in zip(layers, heads)}})
    return heads, {**info, "heads_cached": False, "fit_head_agreement": fit_agree}


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
    g.add_argument("--exit-targets", type=float, nargs="+", default=list(DEFAULT_TARGETS),
                   metavar="A", help="calibration agreement with the reference each fitted "
                                     "threshold must reach")
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


def ladder(*, exit_rules=RULES, exit_targets=DEFAULT_TARGETS, exit_thresholds=None,
           exit_layers=None, exit_label_mix=0.0, exit_bits=None, exit_group_size=64):
    """The variant configs of one sweep: rule × (targets or thresholds) × bits."""
    if not exit_rules:
        raise ValueError("no exit rule given; pass e.g. --exit-rules entropy")
    layers = tuple(int(a) for a in exit_layers) if exit_layers else None
    out = []
    for rule in dict.fromkeys(exit_rules):
        values = ([dict(threshold=float(t), target=None) for t in exit_thresholds]
                  if exit_thresholds else [dict(target=float(a)) for a in exit_targets])
        if not values:
            raise ValueError("no targets or thresholds given; pass e.g. --exit-targets 0.99")
        for v in values:
            for b in (exit_bits or [None]):
                out.append(ExitConfig(rule=rule, exit_layers=layers, label_mix=exit_label_mix,
                                      bits=b, group_size=exit_group_size, **v))
    return list({c.name: c for c in out}.values())


def run_name(*, exit_thresholds=None, exit_bits=None, **_):
    """Default run-folder suffix for these parameters."""
    return ("fixed" if exit_thresholds else "target") + (
        "" if not exit_bits else "-q" + "-".join(map(str, exit_bits)))


def _layers_of(cfg, n_layers):
    return tuple(cfg.exit_layers) if cfg.exit_layers else tuple(range(1, n_layers))


def check_model(module, cfgs, model=None):
    """Reject, before a sweep writes anything, exit layers outside [1, N), a patience longer
    than the number of heads (it could never fire), or a decision model without a linear head
    (``model`` = the registry name; minilm-choice). ``module``: the encoder."""
    if model == "minilm-choice":
        raise ValueError("early exit supports decision models with a linear head "
                         "(minilm-sentiment); minilm-choice scores options by cosine and has none")
    layers = getattr(module, "layers", None)
    if layers is None:
        raise ValueError(f"{type(module).__name__} has no per-layer access (a `layers` list); "
                         "early exit needs one")
    n = len(layers)
    for cfg in cfgs:
        ls = _layers_of(cfg, n)
        bad = [a for a in ls if not 1 <= a < n]
        if bad:
            raise ValueError(f"exit_layers {bad} are outside [1, {n}) for this {n}-layer encoder")
        if cfg.rule == "patience" and cfg.threshold is not None and cfg.threshold > len(ls):
            raise ValueError(f"exit_threshold={int(cfg.threshold)} for rule patience exceeds the "
                             f"{len(ls)} exit heads: no calibration example can meet it")


_FEATS = OrderedDict()  # (id(module), calibration fingerprint, layers) -> calibration features
_MEMO = OrderedDict()  # (id(module), cfg without mode, calibration fingerprint) -> fitted state


def build(reference, cfg, mode="simulated", calibration=None, *, cache_dir=None, fit=None):
    """Registry entry: the reference DecisionModel with distilled exit heads and a fitted rule.

    Parameters
    ----------
    reference : DecisionModel
        Its ``module`` has ``encoder`` (with ``layers``) and a linear ``head``.
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
        ``rule``, ``threshold``, ``target``, ``exit_layers``, ``calibration_agreement``,
        ``expected_cost`` (mean fraction of layers run on calibration), ``work_ratio``,
        ``ideal_speedup`` = 1 / expected cost, ``exit_histogram`` (calibration, layer -> count),
        ``near_tie_mean_exit_layer`` / ``other_mean_exit_layer``, head training facts.

    Raises
    ------
    ValueError
        Unknown mode, a module without per-layer access or without a linear head
        (minilm-choice), no calibration split, a fixed threshold no calibration example meets.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    module = reference.module
    if "encoder" not in module or not hasattr(module["encoder"], "layers"):
        raise ValueError(f"{type(module).__name__} has no per-layer access (module.encoder."
                         "layers); early exit needs one")
    if "head" not in module or not isinstance(module["head"], nn.Linear):
        raise ValueError(f"early exit supports decision models with a linear head "
                         f"(minilm-sentiment); {reference.name!r} ({type(module).__name__}) has "
                         "none: choose --family prune or quant for it")
    if calibration is None:
        raise ValueError("early exit needs the calibration split to choose its threshold "
                         "(build(reference, cfg, calibration=...))")
    n_layers = len(module.encoder.layers)
    check_model(module.encoder, [cfg])
    layers = _layers_of(cfg, n_layers)
    base, qinfo = module, None
    if cfg.bits is not None:
        base, qinfo = quantize_module(module, QuantConfig(cfg.bits, cfg.group_size), mode)
    key = (id(module), cfg, calibration.fingerprint())
    state = _MEMO.get(key)
    if state is None or state[0] is not module:
        heads, hinfo = trained_heads(reference, layers, cfg.label_mix, fit=fit,
                                     cache_dir=cache_dir)
        qsim = base if cfg.bits is None or mode == "simulated" else quantize_module(
            module, QuantConfig(cfg.bits, cfg.group_size), "simulated")[0]
        fkey = (id(qsim), calibration.fingerprint(), layers)
        hit = _FEATS.get(fkey)
        if hit is not None and hit[0] is qsim:
            feats, final_logits = hit[1:]
        else:
            batches, _ = reference.prepare(calibration)
            feats, final_logits, _ = layer_features(qsim, batches, layers)
            _FEATS[fkey] = (qsim, feats, final_logits)
            while len(_FEATS) > 2:
                _FEATS.popitem(last=False)
        ref_feats_logits = final_logits if qsim is module else layer_features(
            module, reference.prepare(calibration)[0], [])[1]
        ref_pred = ref_feats_logits.argmax(-1)
        head_logits = [feats[l] @ w.T.astype(np.float64) + b for l, (w, b) in zip(layers, heads)]
        if cfg.target is not None:
            threshold, agree, cost = fit_threshold(head_logits, final_logits, ref_pred, cfg.rule,
                                                   cfg.target, layers, n_layers)
        else:
            threshold = cfg.threshold
        el, lg = simulate(head_logits, final_logits, cfg.rule, threshold, layers, n_layers)
        if cfg.threshold is not None and not (el < n_layers).any():
            raise ValueError(f"exit_threshold={cfg.threshold} ({cfg.rule}) fires on none of the "
                             f"{len(el)} calibration examples: the variant would be the reference"
                             "; pass a looser threshold")
        agree = float((lg.argmax(-1) == ref_pred).mean())
        top = np.sort(ref_feats_logits, axis=-1)
        near = (top[:, -1] - top[:, -2]) < NEAR_TIE_MARGIN
        hist = {int(l): int((el == l).sum()) for l in (*layers, n_layers)}
        info = {"rule": cfg.rule, "target": cfg.target, "threshold": float(threshold),
                "threshold_fitted_on": "calibration" if cfg.target is not None else "fixed",
                "exit_layers": list(layers), "n_layers": n_layers, "label_mix": cfg.label_mix,
                "calibration_agreement": agree, "n_calibration": len(el),
                "expected_cost": float(el.mean() / n_layers),
                "exit_histogram": hist,
                "exited_early_share": float((el < n_layers).mean()),
                "near_tie_margin": NEAR_TIE_MARGIN, "n_near_tie": int(near.sum()),
                "near_tie_mean_exit_layer": float(el[near].mean()) if near.any() else None,
                "other_mean_exit_layer": float(el[~near].mean()) if (~near).any() else None,
                "near_tie_ran_all_share": float((el[near] == n_layers).mean()) if near.any()
                else None,
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
    if qinfo is not None:
        info.update(quant=qinfo, bits_per_weight=qinfo["bits_per_weight"],
                    bits_per_weight_note="bits per quantized weight",
                    model_bytes=qinfo["model_bytes"])
    else:
        info.update(bits_per_weight=32.0, bits_per_weight_note="fp32 weights (not quantized)",
                    model_bytes=int(sum(v.nbytes for _, v in tree_flatten(module.parameters()))))
    mlx_heads = []
    for w, b in heads:
        h = nn.Linear(w.shape[1], w.shape[0])
        h.weight, h.bias = mx.array(w), mx.array(b)
        mlx_heads.append(h)
    wrapper = ExitNet(base, mlx_heads, layers, cfg.rule, threshold)
    return reference.replace_module(wrapper), info


def describe(info, timing=None):
    """Markdown lines: threshold, calibration agreement, exit histogram, near ties, speed."""
    hist = ", ".join(f"L{k}: {v}" for k, v in info["exit_histogram"].items())
    thr = info["threshold"]
    lines = [f"- rule `{info['rule']}`, threshold {thr:.4g} ({info['threshold_fitted_on']}"
             + (f", target agreement {info['target']}" if info.get("target") else "") + "); "
             f"heads after layers {info['exit_layers']} ({info['fit_source']})",
             f"- calibration: agreement {info['calibration_agreement']:.4f}, exit histogram "
             f"{hist}; expected cost {info['expected_cost']:.3f} of the layers → ideal speed-up "
             f"{info['ideal_speedup']:.2f}×"]
    if info.get("n_near_tie"):
        lines.append(f"- near ties (reference margin < {info['near_tie_margin']}, "
                     f"n={info['n_near_tie']}): mean exit layer "
                     f"{info['near_tie_mean_exit_layer']:.2f} vs {info['other_mean_exit_layer']:.2f}"
                     f" for the rest; {info['near_tie_ran_all_share']:.0%} ran every layer")
    lines += realised_speed_lines(timing, info["ideal_speedup"])
    return "\n".join(lines) + "\n"
