"""The ``marker`` logits kind: a decision model's multiple-choice layout.

One prompt ``[CLS] question / options [SEP] state [SEP]`` in which each option is introduced by a
marker token (``[marker] token``, default ``[unused0]``); option k's logit is a linear scorer of
the last hidden state at the k-th marker::

    logit_k = w · h[marker_k] + b

The scorer is either fitted on the fit split (``scorer = "fit"``: a conditional logit — softmax
over the options of one weight vector shared by all of them — with an L2 penalty 1/(2C)·|w|², as
scikit-learn's LogisticRegression weighs it; the bias cancels in the softmax and stays 0) or read
from the checkpoint's safetensors (``scorer = "NAME"``: tensors ``NAME.weight`` (1, D) or (D,)
and optionally ``NAME.bias``). Reference: D. McFadden, "Conditional logit analysis of
qualitative choice behavior", 1974.
"""

import copy
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.models.decision import DecisionModel
from variants.models.model_config import ModelConfigError


class MarkerNet(nn.Module):
    """Encoder -> hidden states at the marker positions -> Linear(D, 1) scorer."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.scorer = nn.Linear(encoder.args.hidden_size, 1)

    def states(self, input_ids, attention_mask, token_type_ids, marker_pos):
        """(B, K, D) last hidden states at ``marker_pos`` (B, K) int32."""
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden
        return mx.take_along_axis(hidden, marker_pos[:, :, None], axis=1)

    def readout(self, last_hidden, attention_mask, marker_pos):
        """(B, K) option logits from the encoder's output (B, L, D) at ``marker_pos`` (B, K):
        token positions, so pruning and early exit (which move tokens or rows) refuse it."""
        states = mx.take_along_axis(last_hidden, marker_pos[:, :, None], axis=1)
        return self.scorer(states)[..., 0]

    def __call__(self, input_ids, attention_mask, token_type_ids, marker_pos):
        return self.scorer(self.states(input_ids, attention_mask, token_type_ids,
                                       marker_pos))[..., 0]


def fit_conditional_logit(states, labels, mask, C=1.0):
    """Weight vector w (D,) float64 minimising sum_i -log softmax_k(states[i] @ w)[labels[i]]
    over the valid options (``mask``) + |w|² / (2C): L-BFGS (scipy), then Newton's steps with the
    exact Hessian until a step is below 1e-12 of |w|, one BLAS thread. The loss is strictly
    convex, so the result is its optimum to ~1e-12 whatever L-BFGS's path (which moves with the
    last bits of float32 states from another BLAS or ISA), and the same states give the same w.

    Parameters
    ----------
    states : ndarray (N, K, D) float
    labels : ndarray (N,) int, each >= 0
    mask : ndarray (N, K) bool
    C : float > 0
    """
    from scipy.optimize import minimize
    from scipy.special import log_softmax
    from threadpoolctl import threadpool_limits

    X = np.asarray(states, np.float64)
    y = np.asarray(labels)
    m = np.asarray(mask, bool)
    rows = np.arange(len(y))
    N, K, D = X.shape

    def probs(w):
        logp = log_softmax(np.where(m, X @ w, -np.inf), axis=1)
        return logp, np.where(m, np.exp(logp), 0.0)

    def loss(w):
        logp, p = probs(w)
        grad = -X[rows, y].sum(axis=0) + np.einsum("nk,nkd->d", p, X) + w / C
        return -logp[rows, y].sum() + w @ w / (2 * C), grad

    def hessian(w):
        _, p = probs(w)
        a = (np.sqrt(p)[:, :, None] * X).reshape(N * K, D)
        mean = np.einsum("nk,nkd->nd", p, X)
        return a.T @ a - mean.T @ mean + np.eye(D) / C

    with threadpool_limits(1):  # a BLAS reduction split over threads adds in another order
        w = minimize(loss, np.zeros(D), jac=True, method="L-BFGS-B",
                     options={"maxiter": 2000, "gtol": 1e-8}).x
        f, g = loss(w)
        for _ in range(20):
            step = np.linalg.solve(hessian(w), g)
            if not np.isfinite(step).all():
                break
            f_new, g_new = loss(w - step)
            if f_new > f + 1e-12 * abs(f):  # no progress left at float64's resolution
                break
            w, f, g = w - step, f_new, g_new
            if np.abs(step).max() <= 1e-12 * max(1.0, np.abs(w).max()):
                break
    return w


class MarkerModel(DecisionModel):
    """Marker-token multiple choice (see the module docstring)."""

    name = "marker"

    def __init__(self, module, tokenizer, token, scorer="fit", C=1.0):
        super().__init__(module, tokenizer)
        self.token, self.scorer, self.C = token, scorer, float(C)
        self.marker_id = tokenizer.tokenizer.token_to_id(token)

    def render_options(self, options):
        return " ".join(f"{self.token} {o}" for o in options)

    def model_inputs(self, taskset):
        """(prompt per row, the state texts as the second segment); one segment when the
        prompt itself holds {text}."""
        firsts, _ = super().model_inputs(taskset)
        return firsts, (None if "{text}" in self.prompt else list(taskset.texts))

    def prepare(self, taskset, batch_size=32):
        """As :meth:`DecisionModel.prepare`, plus ``extra["marker_pos"]`` (B, K) int32: the
        position of each option's marker (0 where there is no option).

        Raises
        ------
        ValueError
            A row whose prompt lost markers to truncation (names the row and the fix).
        """
        batches, n_truncated = super().prepare(taskset, batch_size)
        for b in batches:
            ids, idx = np.array(b.input_ids), np.array(b.option_index)
            pos = np.zeros(idx.shape, np.int32)
            for r in range(len(ids)):
                found = np.flatnonzero(ids[r] == self.marker_id)
                k = int((idx[r] >= 0).sum())
                if len(found) != k:
                    raise ValueError(
                        f"row {str(taskset.ids[b.index[r]])!r}: its prompt holds {len(found)} "
                        f"marker tokens {self.token} for {k} options (cut at max_length "
                        f"{getattr(self.tokenizer, 'max_length', '?')} tokens, or the text "
                        "holds the marker); shorten the question or options")
                pos[r, :k] = found
            b.extra["marker_pos"] = mx.array(pos)
        return batches, n_truncated

    def forward(self, batch):
        """(B, K) float32: the scorer at each option's marker, 0 where there is no option."""
        logits = self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                             batch.extra["marker_pos"])
        return mx.where(batch.option_index >= 0, logits, 0.0)

    def fit_head(self, taskset):
        """Fit the scorer on ``taskset``'s labelled rows (:func:`fit_conditional_logit`); a
        scorer read from the checkpoint is kept as it is."""
        if self.scorer != "fit":
            return None
        batches, _ = self.prepare(taskset)
        K = taskset.option_mask.shape[1]
        states = np.zeros((len(taskset), K, self.module.scorer.weight.shape[1]), np.float32)
        for b in batches:
            s = self.module.states(b.input_ids, b.attention_mask, b.token_type_ids,
                                   b.extra["marker_pos"])
            states[b.index] = np.array(s.astype(mx.float32))  # bfloat16: no NumPy dtype
        keep = taskset.labels >= 0
        if not keep.any():
            raise ValueError("the fit split has no labels: the marker scorer cannot be fitted; "
                             "give labels or name the checkpoint's scorer ([marker] scorer)")
        w = fit_conditional_logit(states[keep], taskset.labels[keep], taskset.option_mask[keep],
                                  self.C)
        self.module.scorer.weight = mx.array(w[None].astype(np.float32))
        self.module.scorer.bias = mx.zeros((1,))
        return w

    def head_state(self):
        return {"weight": np.array(self.module.scorer.weight),
                "bias": np.array(self.module.scorer.bias)}

    def load_head_state(self, state):
        self.module.scorer.weight = mx.array(state["weight"])
        self.module.scorer.bias = mx.array(state["bias"])

    def config(self):
        return {"name": self.name, "kind": "marker", "token": self.token, "scorer": self.scorer,
                "C": self.C, **self.settings_config(), "temperatures": self.temperatures}


def _checkpoint_scorer(checkpoint, name, where):
    """(weight (1, D), bias (1,)) named ``name`` in the checkpoint folder's safetensors."""
    folder = Path(checkpoint.path)
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update({k: v for k, v in mx.load(str(f)).items() if k.startswith(name)})
    w = tensors.get(f"{name}.weight", tensors.get(name))
    D = checkpoint.args.hidden_size
    if w is None:
        import difflib

        keys = [k for f in sorted(folder.glob("*.safetensors")) for k in mx.load(str(f))]
        near = difflib.get_close_matches(f"{name}.weight", keys, n=1)
        raise ModelConfigError(f"{where}: [marker] scorer: no tensor {name}.weight in "
                               f"{folder}/*.safetensors; " + (f"did you mean {near[0]!r}?" if near
                                                              else 'use scorer = "fit"'))
    if w.size != D:
        raise ModelConfigError(f"{where}: [marker] scorer: {name}.weight has shape "
                               f"{tuple(w.shape)}, need ({D},) or (1, {D}) (one score per marker)")
    b = tensors.get(f"{name}.bias")
    if b is not None and b.size != 1:
        raise ModelConfigError(f"{where}: [marker] scorer: {name}.bias has shape "
                               f"{tuple(b.shape)}, need () or (1,) (one score per marker)")
    return w.reshape(1, D).astype(mx.float32), (mx.zeros((1,)) if b is None
                                                else b.reshape(1).astype(mx.float32))


def build(checkpoint, cfg):
    """A MarkerModel around ``checkpoint`` for model TOML ``cfg`` (a ModelConfig).

    The marker token is added to a copy of the checkpoint's tokenizer as a special token (kept
    whole, never split); it must already be in the vocabulary, under the same id.

    Raises
    ------
    ModelConfigError
        The token is not in the vocabulary, or the named scorer tensors are missing or misshaped.
    """
    from tokenizers import Tokenizer

    base = checkpoint.tokenizer
    tid = base.tokenizer.token_to_id(cfg.marker_token)
    if tid is None:
        raise ModelConfigError(f"{cfg.path}: [marker] token: {cfg.marker_token!r} is not in the "
                               "checkpoint's vocabulary; use one of its unused tokens, e.g. "
                               "\"[unused0]\"")
    tok = copy.copy(base)
    tok.tokenizer = Tokenizer.from_str(base.tokenizer.to_str())
    tok.tokenizer.add_special_tokens([cfg.marker_token])
    model = MarkerModel(MarkerNet(checkpoint.encoder), tok, cfg.marker_token, cfg.marker_scorer,
                        cfg.marker_C)
    if cfg.marker_scorer != "fit":
        w, b = _checkpoint_scorer(checkpoint, cfg.marker_scorer, cfg.path)
        model.module.scorer.weight, model.module.scorer.bias = w, b
    return model
