"""Decision layer: finish_outputs, temperature scaling, TaskSets, the two models, the plug-in API.

Reference values come from hand computation (in comments), scipy / scikit-learn, or invariants
(batch-size independence, cache round trips). Real-model tests use small real VADER samples.
"""

import math

import mlx.core as mx
import numpy as np
import pytest
from scipy.special import log_softmax, softmax
from scipy.stats import entropy

from variants.datasets import bundled as data
from variants.families import get_family
from variants.families.quant.build import QuantConfig
from variants.models.decision import DecisionModel
from variants.models import choice, fitted_reference, sentiment
from runs.outputs import DecisionOutputs, finish_outputs
from metrics.temperature_fit import fit_calibration_temperature, fits_by_bucket

NEG_BIG = 1e6  # a huge logit on a masked option must change nothing


# ================================ finish_outputs ===============================================

def _hand_case(masked_logit=-NEG_BIG):
    """Two examples, up to 3 options, 3 actions.

    Example 0: 2 valid options, logits (2, 0), T = 0.5 -> z = (4, 0);
      p = (e^4, 1) / (e^4 + 1) = (0.98201379, 0.01798621)   [= sigmoid(4), sigmoid(-4)]
      scores (-1, +1): E[s] = p1 - p0 = -tanh(2) = -0.96402758
      H = -(p0 ln p0 + p1 ln p1) = 0.0900951; confidence = 1 - H / ln 2 = 0.8700198
      actions: option 0 -> a0, option 1 -> a2  => (0.98201379, 0, 0.01798621)
    Example 1: 3 valid options, logits (1, 1, 1), T = 2 -> uniform (1/3, 1/3, 1/3);
      scores all NaN -> E[s] = NaN; H = ln 3 -> confidence 0
      actions: options 0, 1 -> a0, option 2 -> a1 => (2/3, 1/3, 0)
    """
    logits = np.array([[2.0, 0.0, masked_logit], [1.0, 1.0, 1.0]])
    mask = np.array([[True, True, False], [True, True, True]])
    temperature = np.array([0.5, 2.0])
    scores = np.array([[-1.0, 1.0, np.nan], [np.nan, np.nan, np.nan]])
    amap = np.zeros((2, 3, 3))
    amap[0, 0, 0] = amap[0, 1, 2] = 1.0
    amap[1, 0, 0] = amap[1, 1, 0] = amap[1, 2, 1] = 1.0
    kw = dict(ids=["a", "b"], task=["sentiment-2", "domain-3"], labels=[0, -1],
              human_dist=[[0.75, 0.25, np.nan], [np.nan] * 3])
    return (logits, mask, temperature, scores, amap), kw


def test_finish_outputs_hand_computed():
    args, kw = _hand_case()
    out = finish_outputs(*args, **kw)
    p0 = math.exp(4) / (math.exp(4) + 1)
    np.testing.assert_allclose(out.probs, [[0.98201379, 0.01798621, 0.0], [1 / 3, 1 / 3, 1 / 3]],
                               rtol=1e-6, atol=1e-7)
    assert out.probs[0, 2] == 0.0
    np.testing.assert_allclose(out.expected_score[0], -math.tanh(2), rtol=1e-6)
    np.testing.assert_allclose(out.expected_score[0], -0.96402758, rtol=1e-6)
    assert np.isnan(out.expected_score[1])
    np.testing.assert_allclose(out.confidence, [0.8700198, 0.0], atol=1e-6)
    np.testing.assert_allclose(out.action_probs, [[p0, 0.0, 1 - p0], [2 / 3, 1 / 3, 0.0]],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out.action_probs.sum(axis=1), 1.0, rtol=1e-6)
    # stored fields
    np.testing.assert_array_equal(out.logits, [[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # 0 off-mask
    np.testing.assert_array_equal(out.n_options, [2, 3])
    np.testing.assert_array_equal(out.temperature, [0.5, 2.0])
    np.testing.assert_array_equal(out.labels, [0, -1])
    assert out.labels.dtype == np.int64 and out.ids.tolist() == ["a", "b"]
    for name in ("logits", "probs", "expected_score", "confidence", "action_probs", "temperature"):
        assert getattr(out, name).dtype == np.float32, name


def test_finish_outputs_matches_scipy_on_random_rows():
    rng = np.random.default_rng(0)
    n, k, a = 50, 5, 3
    n_opt = rng.integers(1, k + 1, n)
    mask = np.arange(k)[None, :] < n_opt[:, None]
    logits = rng.normal(0, 3, (n, k))
    temperature = rng.uniform(0.2, 3.0, n)
    scores = np.where(mask, rng.normal(size=(n, k)), np.nan)
    amap = np.zeros((n, k, a))
    amap[np.arange(n)[:, None], np.arange(k)[None, :], rng.integers(0, a, (n, k))] = 1.0
    amap *= mask[..., None]
    out = finish_outputs(logits, mask, temperature, scores, amap, ids=np.arange(n).astype(str),
                         task=["t"] * n, labels=np.zeros(n, int), human_dist=np.zeros((n, k)))
    for i in range(n):
        m = mask[i]
        p = softmax(logits[i, m] / temperature[i])
        np.testing.assert_allclose(out.probs[i, m], p, rtol=1e-5, atol=1e-7)
        assert np.all(out.probs[i, ~m] == 0)
        np.testing.assert_allclose(out.expected_score[i], p @ scores[i, m], rtol=1e-5, atol=1e-6)
        conf = 1.0 if m.sum() == 1 else 1 - entropy(p) / np.log(m.sum())
        np.testing.assert_allclose(out.confidence[i], conf, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.action_probs[i], p @ amap[i, m], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.action_probs.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all((out.confidence >= 0) & (out.confidence <= 1))


def test_confidence_extremes():
    """One-hot-ish -> near 1, uniform -> 0, a single valid option (K=1) -> exactly 1."""
    logits = np.array([[30.0, 0.0, 0.0], [0.5, 0.5, 0.5], [7.0, 0.0, 0.0]])
    mask = np.array([[True] * 3, [True] * 3, [True, False, False]])
    out = finish_outputs(logits, mask, np.ones(3), np.full((3, 3), np.nan),
                         np.zeros((3, 3, 1)), ids=list("xyz"), task=["t"] * 3,
                         labels=[-1] * 3, human_dist=np.full((3, 3), np.nan))
    # p = (1 - 2e-30/..., e^-30, e^-30): H ~ 2 * 30 e^-30, confidence 1 - ~1e-12
    assert out.confidence[0] > 1 - 1e-6 and out.confidence[0] <= 1.0
    assert out.confidence[1] == pytest.approx(0.0, abs=1e-6)
    assert out.confidence[2] == 1.0
    np.testing.assert_array_equal(out.probs[2], [1.0, 0.0, 0.0])
    assert np.all(np.isnan(out.expected_score))


@pytest.mark.parametrize("masked_logit", [1e30, np.inf, np.nan, -np.inf])
def test_masked_option_changes_nothing(masked_logit):
    ref_args, kw = _hand_case()
    args, _ = _hand_case(masked_logit)
    ref, out = finish_outputs(*ref_args, **kw), finish_outputs(*args, **kw)
    for name in ("logits", "probs", "expected_score", "confidence", "action_probs"):
        np.testing.assert_array_equal(getattr(out, name), getattr(ref, name), err_msg=name)


@pytest.mark.parametrize("change, match", [
    (dict(temperature=np.array([0.5, 0.0])), "temperature must be > 0"),
    (dict(temperature=np.array([-1.0, 2.0])), "temperature must be > 0"),
    (dict(temperature=np.array([0.5, 2.0, 1.0])), r"temperature must have shape \(2,\)"),
    (dict(mask=np.ones((2, 2), bool)), "must be equal"),
    (dict(logits=np.zeros(3), mask=np.ones(3, bool)), "must be equal"),
    (dict(mask=np.array([[True, True, False], [False, False, False]])), "at least one valid option"),
])
def test_finish_outputs_errors(change, match):
    (logits, mask, temperature, scores, amap), kw = _hand_case()
    cur = dict(logits=logits, mask=mask, temperature=temperature)
    cur.update(change)
    with pytest.raises(ValueError, match=match):
        finish_outputs(cur["logits"], cur["mask"], cur["temperature"], scores, amap, **kw)


def test_outputs_save_load_roundtrip_and_subset(tmp_path):
    args, kw = _hand_case()
    out = finish_outputs(*args, **kw)
    path = out.save(tmp_path / "sub" / "out.npz")
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    back = DecisionOutputs.load(path)
    for name in out.__dataclass_fields__:
        a, b = getattr(out, name), getattr(back, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)  # NaNs compare equal here
    for index in (np.array([False, True]), np.array([1]), np.array([1, 0])):
        sub = out.subset(index)
        assert len(sub) == len(out.ids[index])
        for name in out.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(sub, name), getattr(out, name)[index])
    assert out.subset(np.array([1])).ids.tolist() == ["b"]
    np.testing.assert_array_equal(out.subset(np.array([1, 0])).n_options, [3, 2])


# ================================ temperature scaling ==========================================

def _nll(logits, mask, labels, t):
    """Independent NLL of softmax(logits / t) over valid options."""
    z = np.where(mask, logits / t, -np.inf)
    return -log_softmax(z, axis=1)[np.arange(len(labels)), labels].mean()


def _draw(rng, n, k, t0, k_valid=None):
    """Logits z ~ N(0, 1) (n, k) and labels drawn from softmax(z / t0) over the first k_valid."""
    k_valid = k if k_valid is None else k_valid
    z = rng.normal(size=(n, k))
    mask = np.zeros((n, k), bool)
    mask[:, :k_valid] = True
    p = softmax(z[:, :k_valid] / t0, axis=1)
    labels = (p.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1)
    return z, mask, np.minimum(labels, k_valid - 1)


def test_fit_temperature_recovers_known_temperature():
    t0 = 0.3
    z, mask, labels = _draw(np.random.default_rng(1), 20000, 4, t0)
    t = fit_calibration_temperature(z, mask, labels).temperature
    assert abs(t - t0) / t0 < 0.05
    nll = _nll(z, mask, labels, t)
    for other in (t0, t0 * 1.2, t0 / 1.2, t * 1.001, t / 1.001):
        assert nll <= _nll(z, mask, labels, other) + 1e-12


def test_fit_temperature_ignores_unlabelled_rows_and_masked_options():
    rng = np.random.default_rng(2)
    z, mask, labels = _draw(rng, 3000, 4, 1.5, k_valid=3)
    t = fit_calibration_temperature(z, mask, labels).temperature
    # masked column: any value; unlabelled rows: absurd logits that would dominate the NLL
    z2 = z.copy()
    z2[:, 3] = 1e6
    junk = rng.normal(0, 100, (500, 4))
    t2 = fit_calibration_temperature(np.vstack([z2, junk]),
                                     np.vstack([mask, np.ones((500, 4), bool)]),
                                     np.concatenate([labels, np.full(500, -1)])).temperature
    assert t2 == pytest.approx(t, rel=1e-9)
    assert abs(t - 1.5) / 1.5 < 0.15


def test_fit_temperature_needs_labels():
    with pytest.raises(ValueError, match="at least one labelled example"):
        fit_calibration_temperature(np.zeros((3, 2)), np.ones((3, 2), bool), np.full(3, -1))


def test_fit_bucket_temperatures_one_per_option_count():
    rng = np.random.default_rng(3)
    z4, m4, y4 = _draw(rng, 6000, 4, 0.5)
    z3, m3, y3 = _draw(rng, 6000, 4, 2.0, k_valid=3)
    z2, m2, y2 = _draw(rng, 6000, 4, 1.0, k_valid=2)
    logits = np.vstack([z4, z3, z2])
    mask = np.vstack([m4, m3, m2])
    labels = np.concatenate([y4, y3, y2])
    perm = rng.permutation(len(labels))
    fits = fits_by_bucket(logits[perm], mask[perm], labels[perm], calibration=True)
    temps = {k: f.temperature for k, f in fits.items()}
    assert set(temps) == {2, 3, 4}
    assert all(type(k) is int and type(v) is float for k, v in temps.items())
    for k, t0 in ((4, 0.5), (3, 2.0), (2, 1.0)):
        assert abs(temps[k] - t0) / t0 < 0.1, (k, temps[k])
    assert temps[3] == pytest.approx(fit_calibration_temperature(z3, m3, y3).temperature, rel=1e-9)


# ================================ TaskSets from real data ======================================

@pytest.fixture(scope="module")
def vader():
    return data.load_vader()


@pytest.fixture(scope="module")
def frame400(vader):
    return data.sample(vader, 400, seed=0)


def test_sentiment_taskset(frame400):
    frame = frame400.iloc[:150]
    ts = sentiment.make_taskset(frame)
    n = len(frame)
    assert len(ts) == n
    assert ts.option_texts.shape == (n, 3) and ts.option_mask.shape == (n, 3)
    assert ts.action_map.shape == (n, 3, 3) and ts.human_dist.shape == (n, 3)
    assert ts.option_texts.tolist() == [["negative", "neutral", "positive"]] * n
    assert ts.option_mask.all() and set(ts.task) == {"sentiment-3"}
    np.testing.assert_array_equal(ts.option_scores, np.tile([-1.0, 0.0, 1.0], (n, 1)))
    assert ts.action_names == ("escalate", "review", "none")
    np.testing.assert_array_equal(ts.action_map, np.broadcast_to(np.eye(3), (n, 3, 3)))
    np.testing.assert_array_equal(ts.labels, data.sentiment_label(frame["mean_rating"], 3))
    assert set(ts.labels.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(ts.human_dist.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(ts.human_dist,
                                  data.rater_distribution(frame["rater_scores"].tolist(), 3))
    assert ts.ids.tolist() == frame["id"].tolist() and ts.texts.tolist() == frame["text"].tolist()


def test_choice_taskset(frame400):
    ts = choice.make_taskset(frame400)
    assert ts.option_texts.shape == (400, 5) and ts.action_map.shape == (400, 5, 3)
    assert set(ts.task) == {"sentiment-2", "sentiment-3", "sentiment-5", "domain-4"}
    k = ts.n_options
    expected_k = np.array([int(t.split("-")[1]) for t in ts.task])
    np.testing.assert_array_equal(k, expected_k)
    # valid options come first, contiguously; padding has no text, score, action or raters
    np.testing.assert_array_equal(ts.option_mask, np.arange(5)[None, :] < k[:, None])
    assert np.all(ts.option_texts[~ts.option_mask] == "")
    assert np.all(ts.option_texts[ts.option_mask] != "")
    assert np.all(np.isnan(ts.option_scores[~ts.option_mask]))
    assert np.all(ts.action_map[~ts.option_mask] == 0)
    np.testing.assert_array_equal(ts.action_map[ts.option_mask].sum(axis=1), 1.0)
    means = frame400["mean_rating"].to_numpy()
    dom = ts.task == "domain-4"
    assert np.all(np.isnan(ts.option_scores[dom])) and np.all(np.isnan(ts.human_dist[dom]))
    np.testing.assert_array_equal(ts.labels[dom], data.domain_label(frame400["domain"][dom]))
    assert ts.option_texts[dom][0, :4].tolist() == [choice.DOMAIN_WORDING[d] for d in data.DOMAINS]
    for kk, scores in ((2, [-1, 1]), (3, [-1, 0, 1]), (5, [-2, -1, 0, 1, 2])):
        sel = ts.task == f"sentiment-{kk}"
        assert sel.sum() > 50
        np.testing.assert_array_equal(ts.option_scores[sel][:, :kk], np.tile(scores, (sel.sum(), 1)))
        np.testing.assert_array_equal(ts.labels[sel], data.sentiment_label(means[sel], kk))
        np.testing.assert_allclose(ts.human_dist[sel][:, :kk].sum(axis=1), 1.0, rtol=1e-6)
        assert np.all(np.isnan(ts.human_dist[sel][:, kk:]))
    assert np.all((ts.labels >= 0) & (ts.labels < k))
    # sentiment-5: very negative and negative both escalate
    s5 = ts.action_map[ts.task == "sentiment-5"][0]
    assert s5.argmax(axis=1).tolist() == [0, 0, 1, 2, 2]


def test_taskset_fingerprint_and_subset(frame400):
    frame = frame400.iloc[:40]
    a, b = choice.make_taskset(frame), choice.make_taskset(frame.copy())
    assert a.fingerprint() == b.fingerprint()
    b.texts = b.texts.copy()
    b.texts[7] = b.texts[7] + "!"
    assert a.fingerprint() != b.fingerprint()
    c = choice.make_taskset(frame)
    c.option_texts = c.option_texts.copy()
    c.option_texts[0, 0] = "Something else."
    assert a.fingerprint() != c.fingerprint()
    sub = a.subset(np.array([3, 1]))
    assert sub.action_names == a.action_names == choice.ACTIONS
    assert sub.ids.tolist() == [a.ids[3], a.ids[1]]
    np.testing.assert_array_equal(sub.action_map, a.action_map[[3, 1]])
    assert len(a.subset(a.task == "domain-4")) == int((a.task == "domain-4").sum())


# ================================ real models, real checkpoint =================================

@pytest.fixture(scope="module")
def splits(vader):
    fit = data.sample(data.split_frame(vader, "fit"), 60, seed=0)
    cal = data.sample(data.split_frame(vader, "calibration"), 40, seed=0)
    return fit, cal


@pytest.fixture(scope="module")
def fitted(checkpoint, splits, tmp_path_factory):
    """name -> (model, tasksets, cache_dir, key, log lines of the first call)."""
    out = {}
    for name, mod in (("minilm-sentiment", sentiment), ("minilm-choice", choice)):
        tasksets = {"fit": mod.make_taskset(splits[0]), "calibration": mod.make_taskset(splits[1])}
        cache = tmp_path_factory.mktemp(name)
        logs = []
        model, key = fitted_reference(name, checkpoint, tasksets, cache_dir=cache, log=logs.append)
        out[name] = (model, tasksets, cache, key, logs)
    return out


@pytest.mark.parametrize("name", ["minilm-sentiment", "minilm-choice"])
def test_fitted_reference_and_cache(checkpoint, fitted, name):
    model, tasksets, cache, key, logs = fitted[name]
    cal = tasksets["calibration"]
    assert set(model.temperatures) == set(cal.n_options.tolist())
    # within the search bounds; on 40 items the zero-shot 3-option bucket is worse than uniform,
    # so its NLL optimum sits on the upper bound (1e3), which is legitimate
    assert all(1e-3 * 0.999 <= t <= 1e3 * 1.001 for t in model.temperatures.values())
    assert not any("loaded" in m for m in logs)
    path = cache / "heads" / f"{name}-{key}.npz"
    assert path.exists()
    logs2 = []
    again, key2 = fitted_reference(name, checkpoint, tasksets, cache_dir=cache, log=logs2.append)
    assert key2 == key and again is not model
    assert again.temperatures == model.temperatures
    # each fit's status is recorded (run.json temperature_fits) and survives the head cache
    assert set(model.temperature_fits) == set(model.temperatures)
    assert all(f["status"] in ("converged", "at_bound", "not_converged")
               for f in model.temperature_fits.values())
    assert {k: f["status"] for k, f in again.temperature_fits.items()} == {
        k: f["status"] for k, f in model.temperature_fits.items()}
    assert len(logs2) == 1 and "loaded" in logs2[0]
    np.testing.assert_array_equal(again.raw_logits(cal), model.raw_logits(cal))


@pytest.mark.parametrize("name", ["minilm-sentiment", "minilm-choice"])
def test_model_outputs_valid(fitted, name):
    model, tasksets, *_ = fitted[name]
    cal = tasksets["calibration"]
    out = model.outputs(cal)
    m = cal.option_mask
    assert np.all(np.isfinite(out.probs)) and np.all(np.isfinite(out.logits))
    np.testing.assert_allclose(out.probs.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(out.probs[~m] == 0) and np.all(out.probs[m] > 0)
    np.testing.assert_allclose(out.action_probs.sum(axis=1), 1.0, rtol=1e-5)
    assert out.ids.tolist() == cal.ids.tolist()
    np.testing.assert_array_equal(
        out.temperature, np.float32([model.temperatures[int(k)] for k in cal.n_options]))


@pytest.mark.parametrize("name", ["minilm-sentiment", "minilm-choice"])
def test_outputs_independent_of_batch_size(fitted, name):
    """Length-sorting and per-batch padding must not change any example's logits."""
    model, tasksets, *_ = fitted[name]
    cal = tasksets["calibration"]
    b1, _ = model.prepare(cal, batch_size=1)
    b32, _ = model.prepare(cal, batch_size=32)
    assert len(b1) == len(cal) and len(b32) == 2
    assert b32[0].input_ids.shape[1] < b32[1].input_ids.shape[1]  # padded, length-sorted
    l1, l32 = model.raw_logits(cal, b1), model.raw_logits(cal, b32)
    np.testing.assert_allclose(l1, l32, rtol=1e-4, atol=1e-5)
    assert np.all(l1[~cal.option_mask] == 0)


def test_prepare_rejects_bad_batch_size(fitted):
    model, tasksets, *_ = fitted["minilm-sentiment"]
    for bs in (0, -3):
        with pytest.raises(ValueError, match="batch_size must be >= 1"):
            model.prepare(tasksets["calibration"], batch_size=bs)


def test_sentiment_head_reproduces_sklearn(checkpoint, splits):
    model = sentiment.build(checkpoint)
    fit = sentiment.make_taskset(splits[0])
    clf = model.fit_head(fit)
    tok = checkpoint.tokenizer
    # all texts in one padded batch, in TaskSet order (prepare() sorts by length and cuts at 32)
    ids, mask, types = (mx.array(a) for a in tok.batch(tok.encode(list(fit.texts))[0]))
    emb = np.array(model.module.embed(ids, mask, types))
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    logits = model.raw_logits(fit)
    np.testing.assert_allclose(logits, clf.decision_function(emb), rtol=1e-4, atol=1e-4)
    # multinomial head: softmax at T = 1 is sklearn's predict_proba
    np.testing.assert_allclose(softmax(logits, axis=1), clf.predict_proba(emb), atol=1e-4)
    assert clf.C == sentiment.HEAD_C


# ================================ plug-in interface ============================================

HIDDEN = 384
PROJECTION = mx.array(np.random.default_rng(7).normal(0, 2.0, (HIDDEN, 3)).astype(np.float32))


class RandomProjectionModel(DecisionModel):
    """A user's model: only ``name`` and ``forward``."""

    name = "user-random-projection"

    def forward(self, batch):
        return self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids) @ PROJECTION


def test_user_model_calibrate_outputs_and_quant_variant(checkpoint, splits):
    assert checkpoint.args.hidden_size == HIDDEN
    model = RandomProjectionModel(choice.EmbeddingNet(checkpoint.encoder), checkpoint.tokenizer)
    cal = sentiment.make_taskset(splits[1])
    with pytest.warns(UserWarning, match=r"bucket K=3 at bound \(T=1000\)"):
        temps = model.calibrate(cal)  # a random projection is no better than uniform: T -> 1000
    assert set(temps) == {3} and temps[3] == 1e3 and model.temperatures == temps
    assert model.temperature_fits[3]["status"] == "at_bound"
    out = model.outputs(cal)
    np.testing.assert_allclose(out.probs.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(np.isfinite(out.expected_score)) and np.all(np.abs(out.expected_score) <= 1)
    variant, info = get_family("quant").build(model, QuantConfig(bits=8), mode="simulated")
    assert isinstance(variant, RandomProjectionModel) and variant.module is not model.module
    assert info["quantized_layers"] == 36 and variant.temperatures == model.temperatures
    vout = variant.outputs(cal)
    delta = np.abs(vout.logits - out.logits).max()
    assert 0 < delta < 0.5, delta
    np.testing.assert_allclose(vout.probs.sum(axis=1), 1.0, rtol=1e-5)
    # building the variant left the reference untouched
    np.testing.assert_array_equal(model.outputs(cal).logits, out.logits)


def test_decision_model_without_forward_raises(checkpoint, splits):
    class NoForward(DecisionModel):
        name = "no-forward"

    model = NoForward(choice.EmbeddingNet(checkpoint.encoder), checkpoint.tokenizer)
    cal = sentiment.make_taskset(splits[1].iloc[:3])
    with pytest.raises(NotImplementedError, match="NoForward must implement forward"):
        model.outputs(cal)
    with pytest.raises(ValueError, match=r"no temperature for option counts \[3\]"):
        RandomProjectionModel(model.module, checkpoint.tokenizer).outputs(cal)


def test_readme_plug_in_example_runs():
    """examples/own_model.py (shown in the README) runs end to end without warnings."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "own_model.py"
    r = subprocess.run([sys.executable, "-W", "error::UserWarning", str(script)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4-bit:" in r.stdout and "agreement" in r.stdout
