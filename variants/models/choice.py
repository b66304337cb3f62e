"""minilm-choice: zero-shot multiple choice (2-5 options) by scaled cosine to option texts."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.datasets import bundled as data
from variants.models.decision import DecisionModel
from variants.arch.encoder import mean_pool
from variants.datasets.tasks import build_taskset

COSINE_SCALE = 20.0  # raw logit = 20 * cos(text, option); temperatures are fitted per K
K_MAX = 5
ACTIONS = ("escalate", "review", "none")

SENTIMENT_WORDING = {
    2: ("This is negative.", "This is positive."),
    3: ("This is negative.", "This is neutral.", "This is positive."),
    5: ("This is very negative.", "This is negative.", "This is neutral.", "This is positive.",
        "This is very positive."),
}
SENTIMENT_SCORES = {2: (-1.0, 1.0), 3: (-1.0, 0.0, 1.0), 5: (-2.0, -1.0, 0.0, 1.0, 2.0)}
SENTIMENT_ACTIONS = {
    2: ("escalate", "none"),
    3: ("escalate", "review", "none"),
    5: ("escalate", "escalate", "review", "none", "none"),
}
DOMAIN_WORDING = {
    "tweet": "A short post on Twitter.",
    "movie": "A review of a film.",
    "product": "A customer review of a product bought online.",
    "news": "A newspaper editorial about politics and society.",
}
# who acts on a routed text: product complaints go to support, tweets to the social team
DOMAIN_ACTIONS = {"tweet": "review", "movie": "none", "product": "escalate", "news": "none"}
TASKS = ("sentiment-2", "sentiment-3", "sentiment-5", "domain-4")
#: How an early-exit head reproduces this model (variants.families.exit.heads): a linear map of
#: an intermediate embedding into the final embedding space, scored by scaled cosine.
EXIT_HEAD_KIND = "cosine"


def _task_of(ids):
    """Each item asks one question, chosen by a stable hash of its id (round-robin-like)."""
    from runs.io import digest

    return [TASKS[int(digest("task", i), 16) % len(TASKS)] for i in ids]


def make_taskset(frame):
    """Questions from real labels: sentiment with 2, 3 or 5 options, or the source domain (4)."""
    rows = []
    means = frame["mean_rating"].to_numpy()
    for r, task, mean in zip(frame.itertuples(index=False), _task_of(frame["id"]), means):
        if task == "domain-4":
            rows.append(dict(id=r.id, task=task, text=r.text,
                             options=[DOMAIN_WORDING[d] for d in data.DOMAINS], scores=None,
                             actions=[DOMAIN_ACTIONS[d] for d in data.DOMAINS],
                             label=int(data.domain_label([r.domain])[0]), human=None))
        else:
            k = int(task.split("-")[1])
            rows.append(dict(id=r.id, task=task, text=r.text, options=list(SENTIMENT_WORDING[k]),
                             scores=list(SENTIMENT_SCORES[k]), actions=list(SENTIMENT_ACTIONS[k]),
                             label=int(data.sentiment_label(np.array([mean]), k)[0]),
                             human=data.rater_distribution([r.rater_scores], k)[0].tolist()))
    return build_taskset(rows, k_max=K_MAX, action_names=ACTIONS)


class EmbeddingNet(nn.Module):
    """Encoder -> mean pooling + L2 norm (sentence-transformers' all-MiniLM-L6-v2 pipeline)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def __call__(self, input_ids, attention_mask, token_type_ids):
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden
        return mean_pool(hidden, attention_mask)

    def readout(self, last_hidden, attention_mask):
        """(B, L, D) hidden states after the encoder, (B, L) mask -> (B, D) embedding."""
        return mean_pool(last_hidden, attention_mask)


class ChoiceModel(DecisionModel):
    """Zero-shot choice: logit_k = COSINE_SCALE * cos(embed(text), embed(option_k)).

    Option texts go through the same (possibly approximated) module; their embeddings are
    computed once per model and reused by every batch (a deployment would cache them too).
    """

    name = "minilm-choice"
    exit_head_kind = EXIT_HEAD_KIND
    #: raw logit = scale * cos (the ``cosine`` logits kind's ``[cosine] scale``)
    scale = COSINE_SCALE

    def _reset_caches(self):
        self._option_emb = None

    def _options(self):
        emb = getattr(self, "_option_emb", None)
        if emb is None or emb.shape[0] < len(self.option_texts):
            encs, _ = self.tokenizer.encode(self.option_texts)
            ids, mask, types = (mx.array(a) for a in self.tokenizer.batch(encs))
            embed = getattr(self.module, "embed_options", None) or self.module
            emb = embed(ids, mask, types)
            mx.eval(emb)
            self._option_emb = emb
        return emb

    def forward(self, batch):
        """(B, K) logits COSINE_SCALE·cos(text, option), 0 where there is no option. A module
        with ``option_logits`` (early exit) scores the options itself."""
        idx = batch.option_index
        opts = self._options()[mx.maximum(idx, 0)]  # (B, K, D)
        scorer = getattr(self.module, "option_logits", None)
        if scorer is not None:
            return scorer(batch.input_ids, batch.attention_mask, batch.token_type_ids, opts,
                          idx >= 0)
        text = self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids)  # (B, D)
        cos = (text[:, None, :] * opts).sum(axis=-1)
        return mx.where(idx >= 0, self.scale * cos, 0.0)

    def config(self):
        # the tasks and their wording are in the TaskSets (and so in their fingerprints)
        return {"name": self.name, "scale": self.scale, **self.settings_config(),
                "temperatures": self.temperatures}


def build(checkpoint):
    return ChoiceModel(EmbeddingNet(checkpoint.encoder), checkpoint.tokenizer)
