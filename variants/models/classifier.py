"""The ``classifier`` logits kind: the checkpoint's own sequence-classification head.

logits = ``checkpoint.classifier(last_hidden (B, L, D), attention_mask (B, L))`` -> (B, n_labels),
the head doing its own pooling (BERT: pooler tanh(dense(CLS)) -> classifier; RoBERTa and
ModernBERT: theirs, see variants.checkpoints.load). The options are the checkpoint's ``id2label`` (or
the model TOML's ``options``), in index order.

What the logits are follows config.json (:mod:`variants.models.head_output`): a softmax over
the labels (single-label classification), or, for multi-label and regression heads, raw
numbers read per label through a sigmoid or as the output value. Those are judged from the raw
logits (:mod:`metrics.multilabel`, :mod:`metrics.regression`) and get no fitted temperature
(T = 1 per option count, status ``"fixed"``): a temperature scales a softmax, which they are
not.
"""

import mlx.nn as nn

from variants.models.decision import DecisionModel


class ClassifierNet(nn.Module):
    """Encoder -> the checkpoint's classification head."""

    def __init__(self, encoder, classifier):
        super().__init__()
        self.encoder = encoder
        self.classifier = classifier

    def __call__(self, input_ids, attention_mask, token_type_ids):
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden
        return self.readout(hidden, attention_mask)

    def readout(self, last_hidden, attention_mask):
        """(B, n_labels) logits of the head from the encoder's output (B, L, D) and mask (B, L):
        what pruning and early exit call after the layers they run."""
        return self.classifier(last_hidden, attention_mask)


class ClassifierModel(DecisionModel):
    """Decision model whose logits are the checkpoint's own head's (nothing is fitted but the
    temperatures)."""

    name = "classifier"
    #: early-exit heads distil the head's logits from mean-pooled intermediate states
    exit_head_kind = "linear"
    #: what the logits are (variants.models.head_output.KINDS; ``outputs`` is the method)
    head_outputs = "softmax"

    def forward(self, batch):
        """(B, n_labels) float32 logits of the checkpoint's head."""
        return self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids)

    def config(self):
        out = {"name": self.name, "kind": "classifier", **self.settings_config(),
               "temperatures": self.temperatures}
        if self.head_outputs != "softmax":
            out["outputs"] = self.head_outputs
        return out

    def calibrate(self, taskset, batches=None):
        """Temperatures as :meth:`DecisionModel.calibrate` for a softmax head; T = 1 for every
        option count of ``taskset`` (status ``"fixed"``) for a multi-label or regression head,
        whose logits no temperature applies to."""
        if self.head_outputs == "softmax":
            return super().calibrate(taskset, batches)
        why = f"a {self.head_outputs} head's logits are not a softmax: no temperature"
        self.temperatures = {int(k): 1.0 for k in sorted(set(taskset.n_options.tolist()))}
        self.temperature_fits = {k: {"temperature": 1.0, "status": "fixed", "reason": why}
                                 for k in self.temperatures}
        return self.temperatures


def build(checkpoint, outputs="softmax"):
    """A ClassifierModel around ``checkpoint`` (its ``classifier`` must not be None) whose logits
    are ``outputs`` (``softmax``, ``multi_label`` or ``regression``)."""
    model = ClassifierModel(ClassifierNet(checkpoint.encoder, checkpoint.classifier),
                            checkpoint.tokenizer)
    model.head_outputs = outputs
    return model
