"""Student family: distillation reduces the loss, the KL equals scipy's, fallback
routing gives the teacher's rows and the student's elsewhere, q and c + q by hand, the cache
hit trains nothing, bad input exits 2 with nothing written."""

import numpy as np
import pytest
from sentiment_fit import fitted_sentiment, sentiment_splits
from scipy.special import softmax
from scipy.stats import entropy

import mlx.core as mx

from variants.datasets import bundled as data
from variants.families.student import build as sb
from variants.families.student import fallback as fb
from variants.families.student import train as st
from variants.families.student.family import StudentConfig, describe, ladder, outputs_info
from variants.cli import main
from variants.models import sentiment


@pytest.fixture(scope="module")
def splits():
    return sentiment_splits(48, 40, 16)


@pytest.fixture(scope="module")
def model(checkpoint, splits):
    return fitted_sentiment(checkpoint, splits)


CFG = StudentConfig(layers=1, target=0.9, epochs=2, train_texts=64)


@pytest.fixture(scope="module")
def built(model, splits, tmp_path_factory):
    cache = tmp_path_factory.mktemp("student-cache")
    variant, info = sb.build(model, CFG, calibration=splits["calibration"], fit=splits["fit"],
                             cache_dir=cache)
    return variant, info, cache


def test_training_reduces_the_distillation_loss(built):
    _, info, _ = built
    curve = info["training"]["curve"]
    assert len(curve) == CFG.epochs + 1 and info["student_cached"] is False
    assert curve[-1] < curve[0]
    assert info["training"]["n_train"] == 64  # 48 fit texts + 16 unlabelled others
    assert "16 unlabelled" in info["training"]["source"]


def test_training_texts_are_never_calibration_or_eval(model, splits):
    ts, _ = st.training_set(model, splits["fit"], 64)
    assert set(data.assign_split(ts.ids)) == {"fit"}
    assert (ts.labels[48:] == -1).all()  # the remainder is read unlabelled


def test_kl_matches_scipy():
    rng = np.random.default_rng(0)
    zt, zs = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    valid = np.ones((5, 4), bool)
    valid[1, 3] = valid[4, 2:] = False
    T = np.array([0.7, 1.0, 1.3, 2.0, 0.9])
    p = np.where(valid, softmax(np.where(valid, zt / T[:, None], -np.inf), axis=1), 0.0)
    q = np.where(valid, softmax(np.where(valid, zs / T[:, None], -np.inf), axis=1), 0.0)
    want = np.mean([entropy(p[i, valid[i]], q[i, valid[i]]) for i in range(5)])
    got = st.kl_to_teacher(mx.array(p.astype(np.float32)), mx.array(zs.astype(np.float32)),
                           mx.array(T.astype(np.float32)), mx.array(valid)).item()
    assert got == pytest.approx(want, rel=1e-5)


def test_init_layers():
    assert st.init_layers(6, 1, "even") == [5]
    assert st.init_layers(6, 2, "even") == [2, 5]
    assert st.init_layers(6, 3, "even") == [1, 3, 5]
    assert st.init_layers(6, 3, "first") == [0, 1, 2]


def test_plain_layer_equals_the_inference_layer(model, splits):
    b = model.prepare(splits["eval"], batch_size=16)[0][0]
    enc = model.module.encoder
    x = enc.embed(b.input_ids, b.token_type_ids)
    ctx = enc.context(b.attention_mask)
    want, _ = enc.apply_layer(0, x, ctx)
    from variants.arch.encoder import attention_bias

    got = st.plain_layer(enc.layers[0], x, attention_bias(b.attention_mask))
    m = np.array(b.attention_mask, bool)
    assert np.abs(np.array(got)[m] - np.array(want)[m]).max() < 1e-4


def test_fallback_rows_are_the_teachers_and_the_rest_the_students(model, built, splits):
    variant, info, _ = built
    net = variant.module
    b = model.prepare(splits["eval"], batch_size=16)[0][0]
    out = np.array(net(b.input_ids, b.attention_mask, b.token_type_ids))
    route = net.last_routed
    s = np.array(net.student(b.input_ids, b.attention_mask, b.token_type_ids))
    assert np.array_equal(out[~route], s[~route])  # student rows: bit-identical
    t_full = np.array(model.module(b.input_ids, b.attention_mask, b.token_type_ids))
    if route.any():  # teacher rows: the teacher's logits (its sub-batch: float round-off)
        idx = mx.array(np.nonzero(route)[0].astype(np.int32))
        m = b.attention_mask[idx]
        L = int(m.sum(axis=1).max().item())
        t_sub = np.array(model.module(b.input_ids[idx][:, :L], m[:, :L],
                                      b.token_type_ids[idx][:, :L]))
        assert np.array_equal(out[route], t_sub)
        assert np.abs(out[route] - t_full[route]).max() < 1e-4
    # routing: the rule statistic at the teacher's temperature against τ
    stat = fb.rule_statistic(s, info["rule"], None, np.full(len(s), model.temperatures[3]))
    assert np.array_equal(route, stat >= info["threshold"])
    assert np.array_equal(net.last_exit_layer, np.where(route, 1 + 6, 1))


def test_forced_routing_all_and_none(model, built, splits):
    variant, _, _ = built
    net = variant.module
    b = model.prepare(splits["eval"], batch_size=16)[0][0]
    args = (b.input_ids, b.attention_mask, b.token_type_ids)
    net._threshold = 0.0  # entropy < 0 never: every row to the teacher
    assert np.array_equal(np.array(net(*args)), np.array(model.module(*args)))
    net._threshold = 2.0  # entropy < 2 always: the student answers everything
    assert np.array_equal(np.array(net(*args)), np.array(net.student(*args)))
    net._threshold = variant.module._threshold = built[1]["threshold"]


def test_fit_fallback_by_hand():
    # student logits with entropies ordered by row; predictions vs the reference
    s = np.log(np.array([[0.98, 0.01, 0.01], [0.9, 0.05, 0.05], [0.6, 0.3, 0.1],
                         [0.4, 0.35, 0.25]]))
    t = np.log(np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8],
                         [0.2, 0.7, 0.1]]))
    ref = np.array([0, 1, 2, 1])  # the student is right on row 0 only
    r = fb.fit_fallback(s, t, ref, "entropy", 0.75)
    # route rows 1..3 (the three least confident) -> 4/4; routing only 2 and 3 -> 3/4 = 0.75
    assert r["q"] == pytest.approx(0.5) and r["agreement"] == pytest.approx(0.75)
    assert r["student_agreement"] == pytest.approx(0.25)
    route = fb.routed(r["stat"], "entropy", r["threshold"])
    assert route.tolist() == [False, False, True, True]
    r1 = fb.fit_fallback(s, t, ref, "entropy", 1.0)
    assert r1["q"] == pytest.approx(0.75) and r1["agreement"] == 1.0
    rm = fb.fit_fallback(s, t, ref, "margin", 1.0)
    assert rm["q"] == pytest.approx(0.75)


def test_q_and_cost_model_by_hand(built):
    _, info, _ = built

    class O:
        exit_layer = np.array([1, 7, 1, 1, 7, 1, 1, 1])

    ev = outputs_info({"student_layers": 1}, {"eval": O()})["eval"]
    assert ev == {"n": 8, "n_fallback": 2, "q": 0.25}
    assert info["expected_cost"] == pytest.approx(info["c"] + info["calibration_q"])
    assert 0 < info["c"] < 1
    text = describe({**info, "eval": ev}, None)
    assert f"c + q = {info['c']:.3f} + 0.250 = {info['c'] + 0.25:.3f}" in text
    assert "| 0 |" in text and f"| {CFG.epochs} |" in text


def test_cache_hit_trains_nothing(model, built, splits, monkeypatch):
    _, info, cache = built
    files = list((cache / "students").glob("*.safetensors"))
    assert len(files) == 1
    sb._STUDENTS.clear()
    monkeypatch.setattr(st, "distill", lambda *a, **k: pytest.fail("trained again"))
    variant, info2 = sb.build(model, CFG, calibration=splits["calibration"],
                              fit=splits["fit"], cache_dir=cache)
    assert info2["student_cached"] is True
    assert info2["training"]["curve"] == pytest.approx(info["training"]["curve"])
    b = model.prepare(splits["eval"], batch_size=16)[0][0]
    args = (b.input_ids, b.attention_mask, b.token_type_ids)
    assert np.array_equal(np.array(variant.module.student(*args)),
                          np.array(built[0].module.student(*args)))


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers=0), "--student-layers 0 must be an integer >= 1"),
    (dict(layers=-1), "--student-layers -1 must be an integer >= 1"),
    (dict(target=0.0), "--fallback-targets 0.0 is outside (0, 1]"),
    (dict(target=1.5), "--fallback-targets 1.5 is outside (0, 1]"),
    (dict(rule="patience"), "--fallback-rule 'patience' is not known"),
])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError) as e:
        StudentConfig(**kwargs)
    assert message in str(e.value)


def test_ladder_names():
    names = [c.name for c in ladder(student_layers=[1, 2], fallback_targets=[0.99, 0.97])]
    assert names == ["student-l1-entropy-ag0.99", "student-l1-entropy-ag0.97",
                     "student-l2-entropy-ag0.99", "student-l2-entropy-ag0.97"]


def test_deeper_student_refused(model):
    with pytest.raises(ValueError, match="fewer layers than the teacher's 6; pass 1..5"):
        sb.check_model(model.module, [StudentConfig(layers=6)])


@pytest.mark.parametrize("args, message", [
    (["--student-layers", "6"], "--student-layers 6: a student must have fewer layers than "
                                "the teacher's 6"),
    (["--student-layers", "9"], "--student-layers 9: a student must have fewer layers"),
    (["--student-layers", "0"], "--student-layers 0 must be an integer >= 1"),
    (["--fallback-targets", "1.01"], "--fallback-targets 1.01 is outside (0, 1]"),
    (["--fallback-targets", "0"], "--fallback-targets 0.0 is outside (0, 1]"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main(["sweep", "--family", "student", "--results-dir", str(tmp_path / "r"),
                 "--n-fit", "20", "--n-calibration", "20", "--n-eval", "20", "--no-progress",
                 "--timing-batch-sizes", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


# -- minilm-choice: the shared head is the cosine to the teacher's option embeddings ---------

def test_choice_student_routes_to_the_teacher(checkpoint, tmp_path):
    from variants.models import choice

    fr = data.load_vader()
    sp = {s: choice.make_taskset(data.sample(data.split_frame(fr, s), n, seed=1))
          for s, n in (("fit", 32), ("calibration", 40), ("eval", 16))}
    m = choice.build(checkpoint)
    m.calibrate(sp["calibration"])
    variant, info = sb.build(m, StudentConfig(layers=1, target=0.9, epochs=1, train_texts=32),
                             calibration=sp["calibration"], fit=sp["fit"], cache_dir=tmp_path)
    assert info["head_kind"] == "cosine" and len(info["training"]["curve"]) == 2
    got = variant.raw_logits(sp["eval"])
    ref = m.raw_logits(sp["eval"])
    route = variant.last_exit_layer > 1
    assert np.abs(got[route] - ref[route]).max(initial=0) < 1e-4
    # the student's rows: 20·cos(student embedding, the teacher's option embedding)
    b = m.prepare(sp["eval"], batch_size=32)[0][0]
    emb = variant.module.student(b.input_ids, b.attention_mask, b.token_type_ids)
    opts = m._options()[mx.maximum(b.option_index, 0)]
    want = np.array(mx.where(b.option_index >= 0,
                             20.0 * (emb[:, None, :] * opts).sum(-1), 0.0))
    keep = ~route[b.index]
    assert np.abs(got[b.index][keep] - want[keep]).max(initial=0) < 1e-4


def test_hidden_mse_by_hand():
    rng = np.random.default_rng(1)
    hs = [rng.normal(size=(2, 3, 4)).astype(np.float32) for _ in range(2)]
    ht = [rng.normal(size=(2, 3, 4)).astype(np.float32) for _ in range(2)]
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    m = mask.astype(bool)
    want = np.mean([((a - b)[m] ** 2).mean() for a, b in zip(hs, ht)])
    got = st.hidden_mse([mx.array(a) for a in hs], [mx.array(b) for b in ht], mx.array(mask))
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_hidden_matching_trains(model, splits):
    ts = splits["fit"].subset(np.arange(32))
    student = st.make_student(model.module, [0])
    w = np.array(model.module.encoder.layers[0].intermediate.weight)
    curve, _ = st.distill(model, student, [0], ts, "linear", epochs=2, lr=3e-5,
                          hidden_weight=1.0)
    assert curve[-1] < curve[0]
    # the teacher's layer 0 is untouched; the student's copy moved
    assert np.array_equal(np.array(model.module.encoder.layers[0].intermediate.weight), w)
    assert not np.array_equal(np.array(student.encoder.layers[0].intermediate.weight), w)


def test_full_depth_student_has_zero_loss_so_targets_align_with_inputs(model, splits):
    """A 'student' holding all six teacher layers is the teacher: its distillation loss (KL +
    hidden MSE) before training is ~0 only if each batch's teacher targets belong to that
    batch's texts (length-sorted batches, shuffled order, fit + unlabelled rows); with the
    targets of the batches rotated by one (the bug this rules out) the same loss is large."""
    ts = splits["fit"].subset(np.arange(32))  # two full batches of 16 (enough to rotate)
    full = st.make_student(model.module, list(range(6)))
    curve, _ = st.distill(model, full, list(range(6)), ts, "linear", epochs=1, lr=1e-12,
                          hidden_weight=1.0)
    assert curve[0] < 1e-6 and curve[1] < 1e-6
    batches, _ = model.prepare(ts, batch_size=16)
    tg = st.teacher_targets(model, ts, batches, "linear")
    t = np.array(model.module(batches[0].input_ids, batches[0].attention_mask,
                              batches[0].token_type_ids))
    p_want = softmax(t / model.temperatures[3], axis=1)
    assert np.abs(np.array(tg[0][0]) - p_want).max() < 1e-5
    wrong = st.kl_to_teacher(tg[1][0][:len(batches[0].index)], mx.array(t), tg[0][1], tg[0][2])
    assert len(batches) > 1 and wrong.item() > 1e-3


def test_student_inference_equals_its_training_path_on_padded_batches(model, splits):
    """The trained student's fast inference forward (streams, fused weights, mean pooling over
    real tokens) gives the logits of the plain path it was trained through, on batches with
    padding: a stale fused-weight cache or a different mask would show here."""
    ts = splits["fit"].subset(np.arange(32))
    student = st.make_student(model.module, [0, 1])
    st.distill(model, student, [0, 1], ts, "linear", epochs=1, lr=1e-3, hidden_weight=0.0)
    b = model.prepare(splits["eval"], batch_size=16)[0][0]
    assert not bool(b.attention_mask.all().item())  # padded
    fast = np.array(student(b.input_ids, b.attention_mask, b.token_type_ids))
    last, _ = st.forward_hidden(student, b.input_ids, b.attention_mask, b.token_type_ids)
    plain = np.array(st.student_logits(student, "linear", last, b.attention_mask))
    untrained = np.array(st.make_student(model.module, [0, 1])(
        b.input_ids, b.attention_mask, b.token_type_ids))
    assert np.abs(fast - plain).max() < 1e-4
    assert np.abs(fast - untrained).max() > 1e-3  # the training moved the student


def test_timing_json_model_bytes_agree_with_build_json(model, built):
    """timing.json's model_bytes.variant (variants.sweep.timing.time_pair) counts the shared
    embeddings and head once, as build.json does: teacher + the student's own layers."""
    from types import SimpleNamespace

    from mlx.utils import tree_flatten

    from variants.sweep.timing import time_pair

    variant, info, _ = built
    cfg = SimpleNamespace(speed_mode="simulated", timing_warmup=0, timing_rounds=1,
                          timing_min_rounds=1, timing_budget_s=1.0)
    got = time_pair(model, variant, {}, cfg)["model_bytes"]  # no batch size: nothing timed
    teacher = sum(v.nbytes for _, v in tree_flatten(model.module.parameters()))
    own = sum(v.nbytes for _, v in tree_flatten(variant.module.student.encoder.layers))
    assert got == {"reference": teacher, "variant": teacher + own}
    assert got["variant"] == info["model_bytes"]
    # the shared arrays are really reached twice: the tree's plain sum is larger
    plain = sum(v.nbytes for _, v in tree_flatten(variant.module.parameters()))
    assert plain > teacher + own
