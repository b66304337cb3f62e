"""The early-exit forward pass (:class:`ExitNet`): heads after intermediate layers, a rule
checked after each, rows that exit removed from the batch. Built by
:func:`variants.families.exit.build.build`; see that module for the method and references.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.families.exit.heads import cosine_logits, unit
from variants.families.exit.rules import fires, never_fires, predictions, rule_statistic
from variants.arch.encoder import mean_pool



class ExitNet(nn.Module):
    """Wraps a decision module with intermediate heads and an exit rule.

    Parameters
    ----------
    base : nn.Module
        ``encoder`` with the per-layer interface (any architecture) and ``readout`` (see
        :mod:`variants.families.readout`): ``kind='linear'``: the readout gives logits
        (SentimentNet, a checkpoint's classifier); ``kind='cosine'``: it gives the embedding
        (choice.EmbeddingNet). Heads read mean-pooled intermediate states (before
        ``encoder.finish``); the final layer answers through ``readout(finish(x), mask)``.
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

    def __init__(self, base, heads, layers, rule, threshold, kind="linear", temperatures=None,
                 prune=None):
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
        self._prune = None
        if prune is not None:
            self.set_prune(prune)

    def set_prune(self, prune):
        """Prune tokens inside the exit loop (a composed variant): ``prune`` is ``{"points":
        [[layer, keep ratio], ...], "score": 'received' | 'cls', "protected_ids": [int]}``, as
        :class:`variants.families.prune.build.PrunedNet` takes them; None: no pruning."""
        if prune is None:
            self._prune = None
            return
        self._prune = {"points": [[int(a), float(r)] for a, r in prune["points"]],
                       "score": str(prune.get("score", "received")),
                       "protected_ids": [int(i) for i in prune.get("protected_ids", ())]}
        self._never_plain = self._never
        self._never = False  # the pruning loop runs even when no head can fire

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

    def _final(self, hidden, mask, options, valid):
        out = self.base.readout(self.base.encoder.finish(hidden), mask)
        if self._kind == "cosine":
            return cosine_logits(out, options, valid)
        return out

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
        ctx = enc.context(mask)
        heads = dict(zip(self._layers, self.exit_heads))
        prune_at, protected, n_orig = {}, None, None
        if self._prune is not None:  # token pruning inside the loop (a composed variant)
            prune_at = {a: r for a, r in self._prune["points"] if r < 1.0}
            protected = mx.zeros(input_ids.shape, mx.bool_)
            for t in self._prune["protected_ids"]:
                protected = mx.logical_or(protected, input_ids == t)
            n_orig = attention_mask.astype(mx.float32).sum(axis=1)
        valid_np = None if option_valid is None else np.array(option_valid, bool)
        temp = self._temperature(valid_np) if self._kind == "cosine" else None
        active = np.arange(B)
        out = None
        exit_layer = np.full(B, n_layers, np.int64)
        run = np.zeros(B, np.int64)
        prev = np.full(B, -1)
        for i in range(n_layers):
            if trace is not None:
                trace.append((i, tuple(x.shape)))
            ratio = prune_at.get(i + 1) if i + 1 < n_layers else None
            if ratio is None:  # BERT: packed like the reference if padded
                x, _ = enc.apply_layer(i, x, ctx)
            else:
                x, mask, ctx, protected = self._prune_tokens(enc, i, x, ctx, mask, protected,
                                                             ratio * n_orig)
            head = heads.get(i + 1)
            if self._never_heads and head is not None:
                continue
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
            if protected is not None:
                protected, n_orig = protected[idx], n_orig[idx]
            L = int(mask.sum(axis=1).max().item())  # right padding: cut to the longest left
            x, mask = x[idx][:, :L], mask[:, :L]
            if protected is not None:
                protected = protected[:, :L]
            ctx = ctx.take_rows(idx).take_tokens(
                mx.broadcast_to(mx.arange(L, dtype=mx.int32), mask.shape), mask)
            if self._kind == "cosine":
                options, option_valid = options[idx], option_valid[idx]
                valid_np, temp = valid_np[keep], temp[keep]
        final = self._final(x, mask, options, option_valid)
        return self._finish(final, out, active, exit_layer)

    @property
    def _never_heads(self):
        """No head can fire (with pruning on, the loop still runs, the heads are skipped)."""
        return getattr(self, "_never_plain", False)

    def _prune_tokens(self, enc, i, x, ctx, mask, protected, n_target):
        """Layer ``i`` with its attention, then keep the top tokens
        (:func:`variants.families.prune.build.select_tokens`): (x, mask, ctx, protected)."""
        from variants.families.prune.build import importance, select_tokens

        x, attn = enc.apply_layer(i, x, ctx, return_attention=True)
        scores = importance(attn, mask, self._prune["score"])
        index, mask = select_tokens(scores, mask, protected, mx.ceil(n_target - 1e-6))
        x = mx.take_along_axis(x, index[..., None], axis=1)
        protected = mx.take_along_axis(protected, index, axis=1)
        return x, mask, ctx.take_tokens(index, mask), protected

    def _finish(self, final, out, active, exit_layer):
        self.last_exit_layer = exit_layer
        if out is None:
            return final
        out[active] = np.array(final, np.float32)
        return mx.array(out)
