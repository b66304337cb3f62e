"""The student-with-fallback forward pass (:class:`StudentNet`): the student on the whole batch,
then the teacher on the rows the student is unsure of (as a deployment would run it). Built by
:func:`variants.families.student.build.build`; the rule is :mod:`variants.families.student.fallback`.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.families.exit.heads import cosine_logits
from variants.families.student.fallback import routed
from variants.families.exit.rules import rule_statistic


class StudentNet(nn.Module):
    """A decision module: student first, teacher on the routed rows.

    Parameters
    ----------
    student, teacher : nn.Module — decision modules (``encoder`` + ``readout``); the student
        shares the teacher's embeddings and head.
    rule, threshold : the fallback rule ('entropy' | 'margin') and its τ
    kind : {'linear', 'cosine'} — 'linear': the modules return (B, K) logits; 'cosine': they
        return embeddings, scored by :meth:`option_logits` against the teacher's option
        embeddings (:meth:`embed_options`).
    temperatures : dict {K: T} — the teacher's; the rule reads softmax(logits / T_K).

    Linear kind: call like the teacher, (B, L) int32 ids, mask, types -> (B, K) logits. After
    each call ``last_exit_layer`` (B,) int64 holds the encoder layers run per row: the
    student's depth k, or k + the teacher's N for a routed row; ``last_routed`` the (B,) bool
    routing. Routed rows run as one sub-batch cut to their longest real length (right padding).
    """

    def __init__(self, student, teacher, rule, threshold, kind="linear", temperatures=None):
        super().__init__()
        self.student = student
        self.teacher = teacher
        self._rule = rule
        self._threshold = float(threshold)
        self._kind = kind
        self._temperatures = {int(k): float(v) for k, v in (temperatures or {}).items()}
        self._k = len(student.encoder.layers)
        self._n = len(teacher.encoder.layers)
        self.last_exit_layer = None
        self.last_routed = None

    def __call__(self, input_ids, attention_mask, token_type_ids):
        if self._kind == "cosine":  # an embedding net: the teacher's embedding (no routing)
            self.last_exit_layer = None
            return self.teacher(input_ids, attention_mask, token_type_ids)
        return self._route(input_ids, attention_mask, token_type_ids)

    def embed_options(self, input_ids, attention_mask, token_type_ids):
        """(n, D) option-text embeddings by the teacher (computed once per model)."""
        return self.teacher(input_ids, attention_mask, token_type_ids)

    def option_logits(self, input_ids, attention_mask, token_type_ids, options, option_valid):
        """Cosine kind: (B, K) 20·cos logits, student first, teacher on the routed rows."""
        return self._route(input_ids, attention_mask, token_type_ids, options, option_valid)

    def _logits(self, module, ids, mask, types, options, valid):
        out = module(ids, mask, types)
        return out if self._kind == "linear" else cosine_logits(out, options, valid)

    def _temperature(self, valid_np):
        k = valid_np.sum(1)
        missing = sorted(set(k.tolist()) - set(self._temperatures))
        if missing:
            raise ValueError(f"no temperature for option counts {missing}: calibrate the "
                             "reference before building the student variant")
        return np.array([self._temperatures[int(x)] for x in k], np.float64)

    def _route(self, ids, mask, types, options=None, valid=None):
        zs = self._logits(self.student, ids, mask, types, options, valid)
        lg = np.array(zs.astype(mx.float32))  # syncs: routing is data-dependent
        valid_np = (np.ones(lg.shape, bool) if valid is None else np.array(valid, bool))
        stat = rule_statistic(lg, self._rule, valid_np, self._temperature(valid_np))
        route = routed(stat, self._rule, self._threshold)
        self.last_routed = route
        self.last_exit_layer = np.where(route, self._k + self._n, self._k).astype(np.int64)
        if not route.any():
            return zs
        idx = np.nonzero(route)[0]
        sel = mx.array(idx.astype(np.int32))
        m = mask[sel]
        L = int(m.sum(axis=1).max().item())
        zt = self._logits(self.teacher, ids[sel][:, :L], m[:, :L], types[sel][:, :L],
                          None if options is None else options[sel],
                          None if valid is None else valid[sel])
        if len(idx) == lg.shape[0]:
            return zt
        out = lg.copy()
        out[idx] = np.array(zt.astype(mx.float32))
        return mx.array(out)
