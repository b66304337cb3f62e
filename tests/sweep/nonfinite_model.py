"""A factory model whose variants return NaN (or inf) logits on some rows (issue #39).

``--model tests.sweep.nonfinite_model:build`` sweeps examples/own_model.py's prototype model. The
module the factory built is the reference's; any other module (a variant's: every builder makes
a new one, quantized, dequantized, pruned...) gives NaN logits on rows whose first token after
[CLS] has an even id (``inf`` with ``VARIANTS_TEST_NONFINITE=inf``; every row with ``=all``), as
a quantized model that overflows does. ``VARIANTS_TEST_NONFINITE=reference`` makes the
reference's own logits NaN on those rows too.
"""

import os

import mlx.core as mx

from examples.own_model import MyModel, build as build_own

_REFERENCE_MODULES = set()  # id() of each module a factory call built (kept alive by its model)


class _Overflowing(MyModel):
    name = "nonfinite-sentiment"

    def forward(self, batch):
        logits = super().forward(batch)
        how = os.environ.get("VARIANTS_TEST_NONFINITE", "nan")
        if how != "reference" and id(self.module) in _REFERENCE_MODULES:
            return logits
        rows = (batch.input_ids[:, 1] % 2 == 0)[:, None]
        if how == "all":
            rows = mx.ones_like(rows)
        bad = mx.array(float("inf") if how == "inf" else float("nan"))
        return mx.where(rows, bad, logits)


def build(ck):
    """The factory: examples/own_model.py's model, overflowing once it is a variant."""
    own = build_own(ck)
    _REFERENCE_MODULES.add(id(own.module))
    return _Overflowing(own.module, own.tokenizer)
