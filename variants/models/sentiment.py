"""minilm-sentiment: negative / neutral / positive from a linear head on MiniLM embeddings."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from sklearn.linear_model import LogisticRegression

from variants.datasets import bundled as data
from variants.models.decision import DecisionModel
from variants.arch.encoder import mean_pool
from variants.datasets.tasks import build_taskset

OPTIONS = data.SENTIMENT_OPTIONS[3]
SCORES = (-1.0, 0.0, 1.0)
ACTIONS = ("escalate", "review", "none")
OPTION_ACTION = ("escalate", "review", "none")  # negative -> escalate, neutral -> review, ...
HEAD_C = 10.0  # inverse L2 strength of the logistic-regression head
#: the head's solver: Newton (exact Hessian products) on float64 features to a gradient of
#: HEAD_TOL, one BLAS/OpenMP thread. L-BFGS at sklearn's default tol 1e-4 stops wherever its path
#: meets the tolerance, so embeddings 1e-7 apart (another BLAS or ISA) gave heads 1e-2 apart;
#: at a tight tol its ftol stop still left it 2e-5 from the optimum. Newton reaches the optimum
#: (unique: the L2 term makes the loss strictly convex) to ~1e-12 in ~10 steps.
HEAD_SOLVER = "newton-cg"
HEAD_TOL = 1e-12
HEAD_MAX_ITER = 1000
#: How an early-exit head reproduces this model (variants.families.exit.heads): linear logits.
EXIT_HEAD_KIND = "linear"


def make_taskset(frame):
    """One 3-option sentiment question per VADER item (labels and raters binned alike)."""
    labels = data.sentiment_label(frame["mean_rating"].to_numpy(), 3)
    human = data.rater_distribution(frame["rater_scores"].tolist(), 3)
    rows = [dict(id=i, task="sentiment-3", text=t, options=list(OPTIONS), scores=list(SCORES),
                 actions=list(OPTION_ACTION), label=int(y), human=h.tolist())
            for i, t, y, h in zip(frame["id"], frame["text"], labels, human)]
    return build_taskset(rows, k_max=3, action_names=ACTIONS)


def fit_multinomial_head(features, labels, n_classes, C=HEAD_C):
    """The fitted scikit-learn ``LogisticRegression``: the linear head ``coef_`` (n_classes, D)
    and ``intercept_`` (n_classes,), float64, of a multinomial logistic regression (L2 on the
    weight, ``C`` its inverse strength) fitted on ``features``.

    Deterministic on one machine (one BLAS thread, float64, solved to a gradient of
    :data:`HEAD_TOL`): the same features give the same head bit for bit; features 1e-7 apart
    (float32 embeddings from another BLAS or ISA) give heads ~2e-5 apart on the bundled
    2000-row fit split (tests/models/test_reference_fit.py states the bound).

    Parameters
    ----------
    features : ndarray of shape (N, D), float
        Embeddings (cast to float64 here).
    labels : ndarray of shape (N,), int
        Class of each row, in ``range(n_classes)``.
    n_classes : int
    C : float, default=HEAD_C

    Raises
    ------
    ValueError
        Unless every one of the ``n_classes`` classes has a row.
    """
    from threadpoolctl import threadpool_limits

    X = np.asarray(features, np.float64)
    clf = LogisticRegression(C=C, solver=HEAD_SOLVER, tol=HEAD_TOL, max_iter=HEAD_MAX_ITER)
    with threadpool_limits(1):  # a reduction split over threads adds in another order
        clf.fit(X, np.asarray(labels))
    if list(clf.classes_) != list(range(n_classes)):
        raise ValueError(f"the fit split must contain all {n_classes} classes, got "
                         f"{clf.classes_}")
    return clf


class SentimentNet(nn.Module):
    """Encoder -> mean pooling + L2 norm -> Linear(D, 3) head."""

    def __init__(self, encoder, n_classes=3):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.args.hidden_size, n_classes)

    def embed(self, input_ids, attention_mask, token_type_ids):
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden
        return mean_pool(hidden, attention_mask)

    def __call__(self, input_ids, attention_mask, token_type_ids):
        return self.head(self.embed(input_ids, attention_mask, token_type_ids))

    def readout(self, last_hidden, attention_mask):
        """(B, L, D) hidden states after the encoder, (B, L) mask -> (B, 3) head logits (what
        pruning and early exit call after running the layers themselves)."""
        return self.head(mean_pool(last_hidden, attention_mask))


class SentimentModel(DecisionModel):
    """Sentiment decision model; the head is fitted with scikit-learn's LogisticRegression.

    The ``linear-head`` logits kind of a model TOML (:mod:`variants.models.model_config`): ``head_C``
    is its ``[linear_head] C``, the head's classes its options.
    """

    name = "minilm-sentiment"
    exit_head_kind = EXIT_HEAD_KIND
    head_C = HEAD_C

    def forward(self, batch):
        return self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids)

    def fit_head(self, taskset):
        """Fit the linear head on ``taskset``'s embeddings (:func:`fit_multinomial_head`,
        C=``head_C``); returns its LogisticRegression. Raises ValueError unless every one of
        the head's classes has a fit example."""
        batches, _ = self.prepare(taskset)
        emb = np.zeros((len(taskset), self.module.head.weight.shape[1]), np.float32)
        for b in batches:
            e = self.module.embed(b.input_ids, b.attention_mask, b.token_type_ids)
            emb[b.index] = np.array(e.astype(mx.float32))  # bfloat16 (--dtype) has no NumPy dtype
        n = self.module.head.weight.shape[0]
        keep = taskset.labels >= 0
        clf = fit_multinomial_head(emb[keep], taskset.labels[keep], n, self.head_C)
        self.module.head.weight = mx.array(clf.coef_.astype(np.float32))
        self.module.head.bias = mx.array(clf.intercept_.astype(np.float32))
        return clf

    def head_state(self):
        return {"weight": np.array(self.module.head.weight), "bias": np.array(self.module.head.bias)}

    def load_head_state(self, state):
        self.module.head.weight = mx.array(state["weight"])
        self.module.head.bias = mx.array(state["bias"])

    def config(self):
        return {"name": self.name, "head_C": self.head_C, **self.settings_config(),
                "temperatures": self.temperatures}


def build(checkpoint, n_classes=3):
    """An unfitted SentimentModel around ``checkpoint`` (head fitted by the registry)."""
    return SentimentModel(SentimentNet(checkpoint.encoder, n_classes), checkpoint.tokenizer)
