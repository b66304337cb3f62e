"""Token pruning (PoWER-BERT style): after encoder layer ``a`` keep a share ρ of each text's tokens.

After layer ``a`` (1 ≤ a < N) every example keeps ``max(n_protected, ⌈ρ · n_real⌉)`` of its real
tokens, ranked by an attention importance score computed in layer ``a``:

- ``received`` (PoWER-BERT, Goyal et al. 2020, §3.2 "significance score"): the attention each
  token receives, averaged over heads and over the example's real query positions;
- ``cls``: the attention the [CLS] query pays to each token, averaged over heads.

Protected tokens ([CLS], [SEP]; RoBERTa's <s>, </s>) are always kept. Any architecture with the
per-layer interface (``encoder.context`` / ``apply_layer`` / ``finish``) and any decision module
with a plain ``readout`` (:mod:`variants.families.readout`) can be pruned. The kept
tokens are *gathered* into a shorter sequence in their original order (BERT's position
embeddings were added at the embedding layer; ModernBERT's rotary angles and sliding windows
follow each token's original position through ``ctx.take_tokens``), the attention mask and the
module's ``readout`` (pooling + head) follow the kept tokens, and the remaining layers run on the shorter sequence: real work
is skipped, not masked. A ``schedule`` of (layer, keep ratio) pairs prunes at several layers with
the same code (ratios relative to the example's original real-token count, non-increasing).
A point with ρ = 1 keeps every token and is skipped, so a schedule of ρ = 1 points runs the wrapped
module's own forward: its logits are bit-identical to the reference's (the control variant).

Cost model (docs/method.md, "the cost models"): with one pruning point the dense work ratio is
a/N + (1 − a/N)·ρ (per-token Linear work; attention's L² term and the ⌈·⌉ / protected-token
floor are ignored), the ideal speed-up its inverse. ``build`` also reports the ratio realised on
the calibration texts' real token counts.

Composes with quantization (``bits``): the module is quantized by
:func:`variants.families.quant.build.quantize_module` before it is wrapped.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from variants.families.prune.config import PROTECTED_TOKENS, SCORES
from variants.families.quant.build import MODES, QuantConfig, quantize_module
from variants.families.readout import check_readout



# ---------------------------------------------------------------------------------------------
# the pruned forward pass
# ---------------------------------------------------------------------------------------------

def importance(attn, mask, score="received"):
    """Importance of each key token from one layer's attention probabilities.

    Parameters
    ----------
    attn : mx.array of shape (B, H, L, L), float32
        Attention probabilities (query axis 2, key axis 3).
    mask : mx.array of shape (B, L), 0/1
    score : {'received', 'cls'}, default='received'
        ``received``: mean over heads and real queries of the attention a key receives
        (PoWER-BERT, Goyal et al. 2020, §3.2); ``cls``: the [CLS] (position 0) query's attention.

    Returns
    -------
    mx.array of shape (B, L), float32 (padding keys score 0 since they receive no attention).
    """
    if score == "received":
        m = mask.astype(attn.dtype)
        per_query = attn.mean(axis=1)  # (B, L_q, L_k)
        return (per_query * m[:, :, None]).sum(axis=1) / mx.maximum(m.sum(axis=1, keepdims=True), 1)
    if score == "cls":
        return attn[:, :, 0, :].mean(axis=1)
    raise ValueError(f"importance score {score!r} is not known; choose one of {SCORES}")


def select_tokens(scores, mask, protected, n_target):
    """Indices of the tokens to keep, per example, in original order.

    Parameters
    ----------
    scores : mx.array of shape (B, L), float32
        Importance (:func:`importance`); only the order within an example matters.
    mask : mx.array of shape (B, L), 0/1
        Current real tokens.
    protected : mx.array of shape (B, L), bool
        Always kept (only real tokens count).
    n_target : mx.array of shape (B,)
        Tokens to keep per example; raised to the protected count, capped at the real count.

    Returns
    -------
    index : mx.array of shape (B, L') int32, L' = the largest kept count in the batch
    new_mask : mx.array of shape (B, L') int32 (1 for a kept token, 0 for padding)
    """
    B, L = scores.shape
    real = mask.astype(mx.bool_)
    prot = mx.logical_and(protected, real)
    n_keep = mx.minimum(mx.maximum(prot.sum(axis=1), n_target.astype(mx.int32)),
                        real.sum(axis=1)).astype(mx.int32)
    # protected first, then real tokens by score (attention probabilities lie in [0, 1]), padding last
    key = mx.where(prot, 3.0, mx.where(real, 1.0, -1.0)) + mx.clip(scores, 0.0, 1.0)
    order = mx.argsort(-key, axis=1)
    L_new = max(int(n_keep.max().item()), 1)
    top = order[:, :L_new]
    chosen = mx.arange(L_new)[None, :] < n_keep[:, None]
    # restore the original order of the chosen tokens; unchosen slots go to the end as padding
    back = mx.argsort(mx.where(chosen, top, top + L), axis=1)
    index = mx.take_along_axis(top, back, axis=1)
    new_mask = mx.take_along_axis(chosen, back, axis=1).astype(mx.int32)
    return index.astype(mx.int32), new_mask


def keep_counts(n_real, keep_ratio):
    """Tokens kept of ``n_real`` (int array) at ``keep_ratio``: ⌈ρ · n_real⌉ (before the
    protected-token floor)."""
    return np.ceil(keep_ratio * np.asarray(n_real, np.float64) - 1e-6).astype(np.int64)


class PrunedNet(nn.Module):
    """Wraps a decision module (``encoder`` with the per-layer interface + ``readout``, see
    :mod:`variants.families.readout`) and prunes tokens between layers.

    Call like the wrapped module: ``(input_ids, attention_mask, token_type_ids)`` (B, L) int32 ->
    ``base.readout(encoder.finish(x), kept mask)``: head logits (B, K), or the pooled embedding
    (B, D) of an embedding module (minilm-choice's EmbeddingNet: option texts are pruned the
    same way). Any architecture: the layers run through ``encoder.apply_layer`` with a context
    that follows the kept tokens (``ctx.take_tokens``: ModernBERT keeps original positions).
    """

    def __init__(self, base, points, *, score="received", protected_ids=()):
        super().__init__()
        self.base = base
        self._points = tuple(points)  # ((layer, ratio), ...)
        self._score = score
        self._protected_ids = tuple(int(i) for i in protected_ids)

    def __call__(self, input_ids, attention_mask, token_type_ids):
        if not self._pruning:  # every ratio is 1: the wrapped module's own computation, bit for bit
            return self.base(input_ids, attention_mask, token_type_ids)
        return self.forward_trace(input_ids, attention_mask, token_type_ids)[0]

    @property
    def _pruning(self):
        """Whether any point drops tokens (a ratio below 1); ratio-1 points are skipped."""
        return any(r < 1.0 for _, r in self._points)

    def forward_trace(self, input_ids, attention_mask, token_type_ids, trace=None):
        """As ``__call__`` but returns ``(out, kept token ids (B, L'), kept mask (B, L'))``; appends
        ``(layer index, x.shape)`` for every layer's input to ``trace`` when a list is given."""
        enc = self.base.encoder
        x = enc.embed(input_ids, token_type_ids)
        mask = attention_mask
        ctx = enc.context(mask)
        n_orig = attention_mask.astype(mx.float32).sum(axis=1)
        prune_at = {a: r for a, r in self._points if r < 1.0}  # ρ = 1 keeps every token: no-op
        protected = mx.zeros(input_ids.shape, mx.bool_)
        for t in self._protected_ids:
            protected = mx.logical_or(protected, input_ids == t)
        n_layers = len(enc.layers)
        ids = input_ids
        for i in range(n_layers):
            if trace is not None:
                trace.append((i, tuple(x.shape)))
            ratio = prune_at.get(i + 1) if i + 1 < n_layers else None
            if ratio is None:  # BERT: packed like the reference when the batch has padding
                x, _ = enc.apply_layer(i, x, ctx)
            else:
                x, attn = enc.apply_layer(i, x, ctx, return_attention=True)
                scores = importance(attn, mask, self._score)
                index, mask = select_tokens(scores, mask, protected,
                                            mx.ceil(ratio * n_orig - 1e-6))
                x = mx.take_along_axis(x, index[..., None], axis=1)
                protected = mx.take_along_axis(protected, index, axis=1)
                ids = mx.take_along_axis(ids, index, axis=1)
                ctx = ctx.take_tokens(index, mask)
        return self.base.readout(enc.finish(x), mask), ids, mask


# ---------------------------------------------------------------------------------------------
# cost model
# ---------------------------------------------------------------------------------------------

def work_ratio(points, n_layers):
    """Dense-work ratio of a pruning schedule: Σ_layers (tokens kept at that layer) / N.

    One point (a, ρ) gives a/N + (1 − a/N)·ρ (docs/method.md: per-token Linear work;
    attention's L² term, the ⌈·⌉ rounding and protected tokens are ignored).
    """
    kept, total, prev = 1.0, 0.0, 0
    for a, r in points:
        total += (a - prev) * kept
        prev, kept = a, r
    total += (n_layers - prev) * kept
    return total / n_layers


def realised_work_ratio(points, n_layers, n_real, n_protected):
    """The same ratio on real token counts: per example, protected floor and ⌈·⌉ included,
    token-weighted over the examples (``n_real``, ``n_protected``: int arrays (n,))."""
    n_real = np.asarray(n_real, np.int64)
    tokens, prev, cur = 0, 0, n_real.copy()
    for a, r in points:
        tokens += (a - prev) * cur.sum()
        cur = np.minimum(np.maximum(keep_counts(n_real, r), n_protected), n_real)
        prev = a
    tokens += (n_layers - prev) * cur.sum()
    return float(tokens / (n_layers * n_real.sum()))


def check_model(module, cfgs):
    """Reject, before a sweep writes anything, a model pruning cannot rebuild or a pruning layer
    outside [1, N).

    ``module`` is the encoder (anything with a ``layers`` list), or the decision module
    (``encoder`` + ``readout``, checked by :func:`variants.families.readout.check_readout`).

    Raises
    ------
    ValueError
        A decision module without per-layer access or a plain ``readout(last_hidden, mask)``
        (one line, naming why); a config pruning after a layer a with a >= N.
    """
    layers = getattr(module, "layers", None)
    if layers is None:
        check_readout(module, "prune")
        layers = module.encoder.layers
    n = len(layers)
    for cfg in cfgs:
        for a, _ in cfg.points:
            if not 1 <= a < n:
                raise ValueError(f"after_layer={a} is outside [1, {n}) for this {n}-layer "
                                 f"encoder; pass --prune-layers between 1 and {n - 1}")


#: the [CLS]/[SEP] pair of each tokenizer family, tried in order (BERT/ModernBERT, RoBERTa/XLM-R)
SPECIAL_PAIRS = (PROTECTED_TOKENS, ("<s>", "</s>"))


def protected_tokens(tokenizer):
    """The token strings pruning never drops: the first of :data:`SPECIAL_PAIRS` whose tokens
    the ``TextTokenizer`` all knows ([CLS]/[SEP], or RoBERTa's <s>/</s>).

    Raises
    ------
    ValueError
        When the tokenizer has none of the pairs.
    """
    for pair in SPECIAL_PAIRS:
        if all(tokenizer.tokenizer.token_to_id(t) is not None for t in pair):
            return pair
    raise ValueError(f"the tokenizer has none of the token pairs {list(SPECIAL_PAIRS)}; pruning "
                     "cannot protect its sequence start and end")


def protected_ids(tokenizer):
    """Token ids that pruning never drops (:func:`protected_tokens`) from a ``TextTokenizer``."""
    return tuple(tokenizer.tokenizer.token_to_id(t) for t in protected_tokens(tokenizer))


def build(reference, cfg, mode="simulated", calibration=None):
    """Registry entry: the reference DecisionModel with token pruning between encoder layers.

    Parameters
    ----------
    reference : DecisionModel
        Its ``module`` has an ``encoder`` with the per-layer interface and a ``readout``
        (:mod:`variants.families.readout`); any architecture.
    cfg : PruneConfig
    mode : {'native', 'simulated'}, default='simulated'
        Meaningful only with ``cfg.bits`` (passed to ``quantize_module``).
    calibration : TaskSet, optional
        Used only to report the work ratio realised on its real token counts.

    Returns
    -------
    variant : DecisionModel
    info : dict
        ``after_layer``, ``keep_ratio``, ``schedule`` (the points), ``score``, ``protected_ids``,
        ``n_layers``, ``work_ratio`` (cost model), ``ideal_speedup`` = 1 / work_ratio,
        ``calibration_work_ratio`` / ``calibration_ideal_speedup`` (real token counts),
        ``model_bytes``, and with bits the quantizer's info.

    Raises
    ------
    ValueError
        Unknown mode, a layer outside [1, N), a module without a per-layer encoder or a plain
        ``readout`` (e.g. one reading marker-token positions).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    module = reference.module
    check_model(module, [cfg])
    n_layers = len(module.encoder.layers)
    prot = protected_ids(reference.tokenizer)
    info = {"after_layer": cfg.points[0][0], "keep_ratio": cfg.points[-1][1],
            "schedule": [list(p) for p in cfg.points], "score": cfg.score,
            "protected_ids": list(prot),
            "protected_tokens": list(protected_tokens(reference.tokenizer)),
            "n_layers": n_layers}
    base = module
    if cfg.bits is not None:
        base, qinfo = quantize_module(module, QuantConfig(cfg.bits, cfg.group_size), mode)
        info["quant"] = qinfo
        info["bits_per_weight"] = qinfo["bits_per_weight"]
        info["bits_per_weight_note"] = "bits per quantized weight"
        info["model_bytes"] = qinfo["model_bytes"]
    else:
        info["model_bytes"] = int(sum(v.nbytes for _, v in tree_flatten(module.parameters())))
        info["mode"] = "dense (mode not applicable)"
        info["bits_per_weight"] = 32.0
        info["bits_per_weight_note"] = "fp32 weights (not quantized)"
    w = work_ratio(cfg.points, n_layers)
    info.update(work_ratio=w, ideal_speedup=1.0 / w,
                ideal_speedup_note=("cost model a/N + (1 - a/N)·ρ: per-token encoder work; "
                                    "attention's L² term, ⌈·⌉ and protected tokens ignored"))
    if calibration is not None:
        encs, _ = reference.tokenizer.encode(list(calibration.texts))
        n_real = np.array([len(e.ids) for e in encs])
        n_prot = np.array([sum(i in prot for i in e.ids) for e in encs])
        rw = realised_work_ratio(cfg.points, n_layers, n_real, n_prot)
        info.update(calibration_work_ratio=rw, calibration_ideal_speedup=1.0 / rw,
                    calibration_mean_tokens=float(n_real.mean()),
                    calibration_mean_tokens_kept=float(np.minimum(np.maximum(
                        keep_counts(n_real, cfg.points[-1][1]), n_prot), n_real).mean()))
    wrapper = PrunedNet(base, cfg.points, score=cfg.score, protected_ids=prot)
    return reference.replace_module(wrapper), info
