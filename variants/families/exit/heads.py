"""Early exit: intermediate decision heads distilled from the reference (FastBERT, Liu et al. 2020).

Two kinds of head, one per way a decision model turns its sentence embedding into logits:

- ``linear`` (minilm-sentiment, a model with a linear ``head``): after layer l a linear head
  maps the mean-pooled, L2-normalised hidden state f_l (D,) to K logits W f_l + b.
- ``cosine`` (minilm-choice, logit_k = 20·cos(text, option_k)): after layer l a linear map
  A f_l + c into the final embedding space; the head's logits are 20·cos(A f_l + c, o_k) with
  the option embeddings o_k of the full encoder (computed once per option text), read at the
  model's per-K temperature. A is initialised by ridge regression onto the final embedding.

Both are distilled on the **fit** split: cross-entropy to the reference's own probabilities
(FastBERT §3.3, KL up to a constant), optionally mixed with the labels (``label_mix`` λ:
(1 − λ)·KL + λ·CE(label)), L2-regularised (towards 0 for ``linear``, towards the ridge start
for ``cosine``) and solved by L-BFGS (SciPy). Heads are cached keyed by the reference's weights
+ fit data + kind + layers + label mix + regularisation + config and tokenizer settings.
"""

import hashlib

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from scipy.optimize import minimize

from variants.families.exit.rules import masked_probs
from variants.arch.encoder import mean_pool
from runs.io import write_npz

KINDS = ("linear", "cosine")
HEAD_L2 = 1e-3  # L2 strength on head weights (per example)
MAP_L2 = 1e-3  # cosine heads: L2 strength towards the ridge start (per example)
MAP_RIDGE = 1e-2  # cosine heads: ridge of the least-squares start, relative to tr(XᵀX)/D
MAP_MAXITER = 300
FALLBACK_N_FIT = 1000  # fit examples drawn by the builder when the sweep passes no fit split
COSINE_SCALE = 20.0  # as variants.models.choice.COSINE_SCALE (checked by the tests)


# ---------------------------------------------------------------------------------------------
# features of a split
# ---------------------------------------------------------------------------------------------

def cosine_logits(u, opts, valid, scale=COSINE_SCALE):
    """mx: scale·⟨u, o_k⟩ (B, K) for unit rows ``u`` (B, D) and option embeddings ``opts``
    (B, K, D); 0 where ``valid`` (B, K) bool is False."""
    return mx.where(valid, scale * (u[:, None, :] * opts).sum(axis=-1), 0.0)


def unit(z):
    """mx: rows of ``z`` (B, D) scaled to unit L2 norm."""
    return z / mx.maximum(mx.linalg.norm(z, axis=-1, keepdims=True), 1e-12)


def option_embeddings(reference, module):
    """mx (n_options, D): ``module`` (an embedding net) on every option text of ``reference``."""
    return reference.replace_module(module)._options()


def split_features(reference, module, taskset, layers, kind):
    """Everything the heads and thresholds need from one split, run through ``module``.

    Parameters
    ----------
    reference : DecisionModel (its tokenizer, option texts, temperatures)
    module : nn.Module — the reference's module or a (simulated-)quantized copy of it
    taskset : TaskSet
    layers : sequence of int — hidden states to pool (1-based layer index)
    kind : {'linear', 'cosine'}

    Returns
    -------
    dict with ``feats`` {layer: (n, D) float32}, ``final_emb`` (n, D) float32 (pooled last layer),
    ``logits`` (n, K) float64 (the module's own final logits), ``mask`` (n, K) bool,
    ``temperature`` (n,) or None (linear heads use raw logits), ``opts`` (n, K, D) float32 or
    None — all in TaskSet order.
    """
    batches, _ = reference.prepare(taskset)
    O = option_embeddings(reference, module) if kind == "cosine" else None
    feats = {l: [] for l in layers}
    final, logits, order, opts = [], [], [], []
    for b in batches:
        enc = module.encoder(b.input_ids, b.attention_mask, b.token_type_ids,
                             output_hidden_states=True)
        for l in layers:
            feats[l].append(np.array(mean_pool(enc.hidden_states[l], b.attention_mask)))
        pooled = (module.readout(enc.last_hidden, b.attention_mask) if kind == "cosine"
                  else mean_pool(enc.last_hidden, b.attention_mask))  # the embedding scored
        final.append(np.array(pooled))
        if kind == "cosine":
            o = O[mx.maximum(b.option_index, 0)]
            logits.append(np.array(cosine_logits(pooled, o, b.option_index >= 0)))
            opts.append(np.array(o))
        else:
            logits.append(np.array(module.readout(enc.last_hidden, b.attention_mask)))
        order.append(b.index)
    inv = np.argsort(np.concatenate(order))
    return {"feats": {l: np.concatenate(v)[inv] for l, v in feats.items()},
            "final_emb": np.concatenate(final)[inv],
            "logits": np.concatenate(logits)[inv].astype(np.float64),
            "mask": np.asarray(taskset.option_mask, bool),
            "temperature": (reference.temperature_of(taskset).astype(np.float64)
                            if kind == "cosine" else None),
            "opts": np.concatenate(opts)[inv] if kind == "cosine" else None}


def head_logits(kind, head, feats, opts=None, mask=None):
    """NumPy logits (n, K) float64 of one head ``(W, b)`` on pooled features ``feats`` (n, D)."""
    w, b = (np.asarray(a, np.float64) for a in head)
    z = feats @ w.T + b
    if kind == "linear":
        return z
    u = z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
    return np.where(mask, COSINE_SCALE * np.einsum("nd,nkd->nk", u, opts), 0.0)


def _targets(soft, labels, label_mix):
    T = np.asarray(soft, np.float64)
    if label_mix > 0:
        Y = np.zeros_like(T)
        ok = labels >= 0
        Y[ok, labels[ok]] = 1.0
        T = np.where(ok[:, None], (1 - label_mix) * T + label_mix * Y, T)
    return T


# ---------------------------------------------------------------------------------------------
# fitting
# ---------------------------------------------------------------------------------------------

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
    T = _targets(soft_targets, labels, label_mix)

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


def ridge_map(features, targets, ridge=MAP_RIDGE):
    """Least-squares start of a cosine head: (A (D_out, D), c (D_out,)) float64 minimising
    ‖X Aᵀ + c − E‖² + α‖A‖², α = ``ridge``·tr(XᶜᵀXᶜ)/D (X centred)."""
    X = np.asarray(features, np.float64)
    E = np.asarray(targets, np.float64)
    xm, em = X.mean(0), E.mean(0)
    Xc = X - xm
    G = Xc.T @ Xc
    alpha = ridge * np.trace(G) / X.shape[1]
    A = np.linalg.solve(G + alpha * np.eye(X.shape[1]), Xc.T @ (E - em)).T
    return A, em - xm @ A.T


def option_basis(opts, mask, tol=1e-6):
    """Orthonormal basis V (D, r) of the span of the distinct option embeddings in ``opts``
    (n, K, D) at valid ``mask`` (n, K) entries (r ≤ number of distinct options)."""
    o = np.unique(np.asarray(opts, np.float64)[np.asarray(mask, bool)], axis=0)
    u, sv, _ = np.linalg.svd(o.T, full_matrices=False)
    return u[:, sv > tol * sv.max()]


def fit_cosine_head(features, final_emb, opts, mask, temperature, soft_targets, labels=None, *,
                    label_mix=0.0, l2=MAP_L2, maxiter=MAP_MAXITER):
    """Distil one cosine head: q = softmax(20·cos(A f + c, o_k) / T_i) over valid options,
    min (1 − λ)·CE(soft, q) + λ·CE(label, q) + l2/2·‖A − A₀‖² by L-BFGS.

    A₀, c₀ = :func:`ridge_map` of the features onto the final embedding (least squares). The
    distillation then moves A only inside the span V (D, r) of the option embeddings
    (A = A₀ + V B, c = c₀ + V d): the cosines depend on z = A f + c only through Vᵀz and ‖z‖,
    so this keeps the ridge map's norm information and trains r·D instead of D² numbers (r ≤ 9
    option texts on minilm-choice), which is both fast on 2 CPU cores and hard to over-fit.

    Parameters
    ----------
    features : ndarray (n, D) — pooled normalised hidden state after the exit layer
    final_emb : ndarray (n, D) — the reference's final sentence embedding (ridge target)
    opts : ndarray (n, K, D) — option embeddings per example; mask : (n, K) bool
    temperature : ndarray (n,) float > 0 — the model's temperature per example
    soft_targets : ndarray (n, K) — the reference's probabilities at that temperature
    labels : ndarray (n,) int, optional (−1 = unlabeled)

    Returns
    -------
    weight : ndarray (D, D) float32 (A), bias : ndarray (D,) float32 (c)
    """
    X = np.asarray(features, np.float64)
    O = np.asarray(opts, np.float64)
    M = np.asarray(mask, bool)
    Tm = np.asarray(temperature, np.float64)[:, None]
    n, D = X.shape
    Tg = _targets(soft_targets, labels, label_mix) * M
    A0, c0 = ridge_map(X, final_emb)
    V = option_basis(O, M)  # (D, r)
    r = V.shape[1]
    z0 = X @ A0.T + c0
    P0 = z0 @ V  # (n, r)
    R0 = np.maximum((z0 ** 2).sum(1) - (P0 ** 2).sum(1), 0.0)  # ‖z0‖² outside the span
    OV = O @ V  # (n, K, r)

    def loss(theta):
        B, d = theta[:r * D].reshape(r, D), theta[r * D:]
        w = P0 + X @ B.T + d  # Vᵀz
        nz = np.sqrt(np.maximum(R0 + (w ** 2).sum(1), 1e-24))[:, None]  # ‖z‖
        dots = np.einsum("nkr,nr->nk", OV, w)
        a = np.where(M, COSINE_SCALE * dots / nz / Tm, -np.inf)
        a = a - a.max(1, keepdims=True)
        logq = np.where(M, a - np.log(np.exp(a).sum(1, keepdims=True)), 0.0)
        f = -(Tg * logq).sum() / n + 0.5 * l2 * (B ** 2).sum()
        gs = COSINE_SCALE * np.where(M, np.exp(logq) - Tg, 0.0) / n / Tm  # d/d(dots / ‖z‖)
        gw = (np.einsum("nk,nkr->nr", gs, OV) / nz
              - (gs * dots).sum(1, keepdims=True) * w / nz ** 3)
        return f, np.concatenate([(gw.T @ X + l2 * B).ravel(), gw.sum(0)])

    res = minimize(loss, np.zeros(r * D + r), jac=True, method="L-BFGS-B",
                   options={"maxiter": maxiter})
    B, d = res.x[:r * D].reshape(r, D), res.x[r * D:]
    return (A0 + V @ B).astype(np.float32), (c0 + V @ d).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# training + cache
# ---------------------------------------------------------------------------------------------

def module_digest(module):
    """16 hex digits over every parameter of ``module`` (a cache-key part)."""
    h = hashlib.sha256()
    for k, v in tree_flatten(module.parameters()):
        h.update(k.encode())
        h.update(np.asarray(v).tobytes())
    return h.hexdigest()[:16]


def fit_split(reference, fit):
    """``(fit TaskSet, source sentence)``: the sweep's fit split, or FALLBACK_N_FIT drawn here."""
    if fit is not None:
        return fit, f"fit split passed by the sweep ({len(fit)} examples)"
    from variants.datasets import bundled as data
    from variants.models import get_module

    frame = data.sample(data.split_frame(data.load_vader(), "fit"), FALLBACK_N_FIT, seed=0)
    return (get_module(reference.name).make_taskset(frame),
            f"fit split drawn by the builder ({FALLBACK_N_FIT} examples, seed 0): the sweep "
            "passed no fit TaskSet")


def trained_heads(reference, layers, label_mix, fit=None, cache_dir=None, kind="linear"):
    """Heads for ``layers`` (list of (W, b) float32), trained on the fit split or loaded from the
    cache ``cache_dir/exit_heads/`` (key: reference weights + fit data + kind + layers + label mix
    + regularisation + temperatures for cosine heads + the reference's config and tokenizer
    settings, :meth:`~variants.models.decision.DecisionModel.cache_key`). Returns (heads, info).

    Raises
    ------
    ValueError
        Unknown ``kind``; for cosine heads, a reference without a temperature for an option
        count of the fit split (calibrate it first).
    """
    if kind not in KINDS:
        raise ValueError(f"head kind {kind!r} is not known; choose one of {KINDS}")
    fit, source = fit_split(reference, fit)
    version = (HEAD_L2, "fastbert-kl-v1") if kind == "linear" else (
        "cosine-kl-optspan-v1", MAP_L2, MAP_RIDGE, MAP_MAXITER,
        sorted((int(k), float(v)) for k, v in reference.temperatures.items()))
    key = reference.cache_key(module_digest(reference.module), fit.fingerprint(), list(layers),
                              label_mix, *version)
    path = None if cache_dir is None else cache_dir / "exit_heads" / f"{reference.name}-{key}.npz"
    info = {"fit_source": source, "heads_cache_key": key, "n_fit": len(fit), "head_kind": kind}
    if path is not None and path.exists():
        from runs.npz_readers import read_exit_heads  # CorruptFileError names the file

        return read_exit_heads(path, layers), {**info, "heads_cached": True}
    s = split_features(reference, reference.module, fit, layers, kind)
    soft = masked_probs(s["logits"], s["mask"], s["temperature"])
    labels = np.asarray(fit.labels)
    if kind == "linear":
        heads = [fit_head(s["feats"][l], soft, labels, label_mix=label_mix) for l in layers]
    else:
        heads = [fit_cosine_head(s["feats"][l], s["final_emb"], s["opts"], s["mask"],
                                 s["temperature"], soft, labels, label_mix=label_mix)
                 for l in layers]
    ref_pred = np.where(s["mask"], s["logits"], -np.inf).argmax(1)
    fit_agree = {}
    for l, h in zip(layers, heads):
        lg = head_logits(kind, h, s["feats"][l], s["opts"], s["mask"])
        fit_agree[int(l)] = float((np.where(s["mask"], lg, -np.inf).argmax(1) == ref_pred).mean())
    if path is not None:
        write_npz(path, {**{f"w{l}": w for l, (w, _) in zip(layers, heads)},
                         **{f"b{l}": b for l, (_, b) in zip(layers, heads)}})
    return heads, {**info, "heads_cached": False, "fit_head_agreement": fit_agree}
