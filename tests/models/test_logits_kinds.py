"""The four logits kinds of a model TOML on the bundled MiniLM, each against an independent
NumPy / scikit-learn computation; fixed and label-free temperatures."""

import copy
import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from scipy.special import softmax

from variants.models.model_config import ModelConfigError, parse_model_config
from variants.models.configured import ModelSource
from variants.datasets.tasks import build_taskset

TEXTS = ["I love this, best day ever!", "This is awful and I hate it.", "It is a table.",
         "Not bad at all, quite good really.", "Terrible service, never again.",
         "The meeting is at noon."]
LABELS = [2, 0, 1, 2, 0, 1]
OPTIONS = ["negative", "neutral", "positive"]


def _taskset(texts=TEXTS, labels=LABELS, options=OPTIONS):
    rows = [dict(id=str(i), task="t", text=t, options=list(options), scores=None,
                 actions=list(options), label=y, human=None)
            for i, (t, y) in enumerate(zip(texts, labels))]
    return build_taskset(rows, k_max=len(options), action_names=options)


def _source(tmp_path, **raw):
    raw = {"name": "m", "options": OPTIONS, **raw}
    return ModelSource("m", parse_model_config(raw, tmp_path / "m.toml"))


def _embed(checkpoint, texts):
    """Mean-pooled, L2-normalised embeddings computed here, with NumPy (one text at a time)."""
    out = []
    for t in texts:
        encs, _ = checkpoint.tokenizer.encode([t])
        ids, mask, types = checkpoint.tokenizer.batch(encs)
        h = np.array(checkpoint.encoder(mx.array(ids), mx.array(mask), mx.array(types))
                     .last_hidden)[0]
        v = h.mean(axis=0)
        out.append(v / np.linalg.norm(v))
    return np.array(out)


def test_linear_head_is_sklearn_logistic_regression(checkpoint, tmp_path):
    from sklearn.linear_model import LogisticRegression

    model = _source(tmp_path, logits="linear-head", linear_head={"C": 3.0}).build(checkpoint)
    ts = _taskset()
    model.fit_head(ts)
    logits = model.raw_logits(ts)
    assert logits.shape == (6, 3) and model.name == "m" and model.head_C == 3.0
    emb = _embed(checkpoint, TEXTS)
    # the head is the loss's optimum (float64, solved to 1e-12): another solver that reaches it
    # (sklearn's exact-Hessian Newton) gives the same logits to the embeddings' float32 noise
    clf = LogisticRegression(C=3.0, solver="newton-cholesky", tol=1e-12, max_iter=100).fit(
        emb.astype(np.float64), LABELS)
    np.testing.assert_allclose(logits, clf.decision_function(emb), atol=1e-5)


def test_cosine_is_scaled_cosine_to_the_option_texts(checkpoint, tmp_path):
    model = _source(tmp_path, logits="cosine", cosine={"scale": 7.0}).build(checkpoint)
    logits = model.raw_logits(_taskset())
    want = 7.0 * _embed(checkpoint, TEXTS) @ _embed(checkpoint, OPTIONS).T
    assert logits.shape == (6, 3)
    np.testing.assert_allclose(logits, want, atol=2e-5)


class CLSHead(nn.Module):
    """A stand-in sequence-classification head: Linear over the CLS state."""

    def __init__(self, d, n):
        super().__init__()
        self.out = nn.Linear(d, n)

    def __call__(self, hidden, mask):
        return self.out(hidden[:, 0])


def _with_head(checkpoint, labels):
    ck = copy.copy(checkpoint)
    mx.random.seed(0)
    ck.classifier = CLSHead(checkpoint.args.hidden_size, len(labels))
    ck.id2label = list(labels)
    return ck


def test_classifier_uses_the_checkpoint_head_and_its_labels(checkpoint, tmp_path):
    ck = _with_head(checkpoint, ["neg", "pos"])
    src = ModelSource("c", parse_model_config({"name": "c", "logits": "classifier"},
                                              tmp_path / "c.toml"))
    src.bind(ck)
    assert src.fixed_options() == (["neg", "pos"], None, None)
    model = src.build(ck)
    ts = _taskset(labels=[1, 0, 0, 1, 0, 1], options=["neg", "pos"])
    logits = model.raw_logits(ts)
    W, b = np.array(ck.classifier.out.weight), np.array(ck.classifier.out.bias)
    cls = []
    for t in TEXTS:
        ids, mask, types = ck.tokenizer.batch(ck.tokenizer.encode([t])[0])
        cls.append(np.array(ck.encoder(mx.array(ids), mx.array(mask), mx.array(types))
                            .last_hidden)[0, 0])
    assert logits.shape == (6, 2)
    np.testing.assert_allclose(logits, np.array(cls) @ W.T + b, atol=1e-4)


def test_classifier_without_a_head_is_refused(checkpoint, tmp_path):
    src = ModelSource("c", parse_model_config({"name": "c", "logits": "classifier"},
                                              tmp_path / "c.toml"))
    ck = copy.copy(checkpoint)
    ck.classifier = None
    with pytest.raises(ModelConfigError, match="has no sequence-classification head"):
        src.bind(ck)


def test_marker_reads_the_scorer_at_each_marker(checkpoint, tmp_path):
    src = _source(tmp_path, logits="marker", question="How is it?")
    model = src.build(checkpoint)
    ts = _taskset()
    batches, _ = model.prepare(ts, batch_size=4)
    b = batches[0]
    ids, pos = np.array(b.input_ids), np.array(b.extra["marker_pos"])
    assert (np.take_along_axis(ids, pos, 1) == model.marker_id).all()  # [unused0] = id 1
    assert model.marker_id == 1 and (np.diff(pos, axis=1) > 0).all()
    # the shared tokenizer is untouched: a copy holds the marker as a special token
    assert checkpoint.tokenizer.encode(["[unused0]"])[0][0].ids.count(1) == 0
    mx.random.seed(1)
    model.module.scorer.weight = mx.random.normal((1, checkpoint.args.hidden_size))
    logits = model.raw_logits(ts, batches)
    assert logits.shape == (6, 3)
    hidden = np.array(model.module.encoder(b.input_ids, b.attention_mask,
                                           b.token_type_ids).last_hidden)
    w, bias = np.array(model.module.scorer.weight)[0], float(np.array(model.module.scorer.bias)[0])
    want = np.take_along_axis(hidden, pos[:, :, None], 1) @ w + bias
    np.testing.assert_allclose(logits[b.index], want, atol=1e-4)


def test_marker_scorer_fit_is_conditional_logit_equal_to_sklearn_for_two_options():
    """With 2 options, softmax(w·h0, w·h1) = sigmoid(w·(h1 - h0)): scikit-learn's binary
    LogisticRegression without intercept on the differences has the same optimum."""
    from sklearn.linear_model import LogisticRegression

    from variants.models.marker import fit_conditional_logit

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2, 5))
    y = (X[:, 1] - X[:, 0]) @ np.array([1.0, -2.0, 0.5, 0.0, 1.0]) + rng.normal(size=200) > 0
    w = fit_conditional_logit(X, y.astype(int), np.ones((200, 2), bool), C=0.5)
    ref = LogisticRegression(C=0.5, fit_intercept=False, tol=1e-10, max_iter=10000)
    ref.fit(X[:, 1] - X[:, 0], y.astype(int))
    np.testing.assert_allclose(w, ref.coef_[0], rtol=1e-4, atol=1e-5)


def test_marker_scorer_read_from_checkpoint_tensors(checkpoint, tmp_path):
    D = checkpoint.args.hidden_size
    folder = tmp_path / "ck"
    folder.mkdir()
    w = np.arange(D, dtype=np.float32) / D
    mx.save_safetensors(str(folder / "model.safetensors"),
                        {"score.weight": mx.array(w), "score.bias": mx.array([0.5])})
    ck = copy.copy(checkpoint)
    ck.path = folder
    model = _source(tmp_path, logits="marker", marker={"scorer": "score"}).build(ck)
    np.testing.assert_array_equal(np.array(model.module.scorer.weight), w[None])
    assert float(np.array(model.module.scorer.bias)[0]) == 0.5
    model.fit_head(_taskset())  # a checkpoint scorer is not refitted
    np.testing.assert_array_equal(np.array(model.module.scorer.weight), w[None])
    with pytest.raises(ModelConfigError, match=r"no tensor scor\.weight.*did you mean "
                                               r"'score\.weight'"):
        _source(tmp_path, logits="marker", marker={"scorer": "scor"}).build(ck)


def test_fixed_temperature_point_one_is_applied(checkpoint, tmp_path):
    src = _source(tmp_path, logits="cosine", temperature={"mode": "fixed",
                                                          "values": {"3": 0.1}})
    model = src.build(checkpoint)
    ts = _taskset()
    assert model.calibrate(ts) == {3: 0.1}
    assert model.temperature_fits[3]["status"] == "fixed"
    out = model.outputs(ts)
    np.testing.assert_allclose(out.probs, softmax(model.raw_logits(ts) / 0.1, axis=1),
                               atol=1e-5)
    model.fixed_temperatures = {2: 0.1}
    with pytest.raises(ValueError, match=r"no fixed temperature for option counts \[3\]"):
        model.calibrate(ts)


def test_calibration_without_labels_gives_t1_and_a_warning(checkpoint, tmp_path):
    model = _source(tmp_path, logits="cosine").build(checkpoint)
    ts = _taskset(labels=[-1] * 6)
    with pytest.warns(UserWarning, match=r"no labels for option counts \[3\].*1\.0"):
        assert model.calibrate(ts) == {3: 1.0}
    assert model.temperature_fits[3]["status"] == "no_labels"
    np.testing.assert_allclose(model.outputs(ts).probs,
                               softmax(model.raw_logits(ts), axis=1), atol=1e-5)
    # labelled rows are fitted as before: a labelled split gives a fitted T, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = model.calibrate(_taskset())[3]
    assert t != 1.0 and model.temperature_fits[3]["status"] in ("converged", "at_bound")


def test_shipped_sentiment_toml_gives_byte_identical_logits_and_cache_config(checkpoint):
    """--model minilm-sentiment (now the shipped TOML) = the former Python model, byte for byte,
    with the same config() (so the same cache keys as before)."""
    from variants.models import get_module, sentiment

    ts = _taskset()
    new = get_module("minilm-sentiment").build(checkpoint)
    old = sentiment.SentimentModel(sentiment.SentimentNet(checkpoint.encoder),
                                   checkpoint.tokenizer)
    new.fit_head(ts)
    old.fit_head(ts)
    a, b = new.raw_logits(ts), old.raw_logits(ts)
    assert a.tobytes() == b.tobytes()
    assert new.config() == old.config() == {"name": "minilm-sentiment", "head_C": 10.0,
                                            "temperatures": {}}
