"""The ``classifier`` logits kind: the checkpoint's own sequence-classification head.

logits = ``checkpoint.classifier(last_hidden (B, L, D), attention_mask (B, L))`` -> (B, n_labels),
the head doing its own pooling (BERT: pooler tanh(dense(CLS)) -> classifier; RoBERTa and
ModernBERT: theirs, see variants.checkpoints.load). The options are the checkpoint's ``id2label`` (or
the model TOML's ``options``), in index order.
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

    def forward(self, batch):
        """(B, n_labels) float32 logits of the checkpoint's head."""
        return self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids)

    def config(self):
        return {"name": self.name, "kind": "classifier", **self.settings_config(),
                "temperatures": self.temperatures}


def build(checkpoint):
    """A ClassifierModel around ``checkpoint`` (its ``classifier`` must not be None)."""
    return ClassifierModel(ClassifierNet(checkpoint.encoder, checkpoint.classifier),
                           checkpoint.tokenizer)
