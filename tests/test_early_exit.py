"""Early-exit builder (issue #5): a rule that never fires is the reference, the batch really
shrinks, B=1 matches the batch, thresholds come from the calibration split only, bad input."""

import mlx.core as mx
import numpy as np
import pytest

from variants import data
from variants.builders import early_exit as ee
from variants.builders.early_exit import ExitConfig
from variants.cli import main
from variants.models import choice, sentiment


@pytest.fixture(scope="module")
def splits():
    fr = data.load_vader()
    return {s: sentiment.make_taskset(data.sample(data.split_frame(fr, s), n, seed=0))
            for s, n in (("fit", 80), ("calibration", 48), ("eval", 16))}


@pytest.fixture(scope="module")
def model(checkpoint, splits):
    m = sentiment.build(checkpoint)
    m.fit_head(splits["fit"])
    m.calibrate(splits["calibration"])
    return m


@pytest.fixture(scope="module")
def built(model, splits, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    variant, info = ee.build(model, ExitConfig("entropy", target=0.95),
                             calibration=splits["calibration"], cache_dir=cache,
                             fit=splits["fit"])
    return variant, info, cache


@pytest.fixture(scope="module")
def batch(model, splits):
    return model.prepare(splits["eval"], batch_size=16)[0][0]


def _net(variant, rule, threshold):
    w = variant.module
    return ee.ExitNet(w.base, w.exit_heads, w._layers, rule, threshold)


def test_rule_that_never_fires_reproduces_reference(model, built, batch):
    net = _net(built[0], "entropy", 0.0)  # normalised entropy is never < 0
    out = np.array(net(batch.input_ids, batch.attention_mask, batch.token_type_ids))
    np.testing.assert_allclose(out, np.array(model.forward(batch)), rtol=1e-5, atol=1e-5)
    assert (net.last_exit_layer == 6).all()


@pytest.mark.parametrize("threshold", [0.0, 0.3])
def test_batch_shrinks_as_examples_exit(built, batch, threshold):
    net = _net(built[0], "margin", threshold)  # 0.0 fires for every row at the first head
    trace = []
    net.forward_trace(batch.input_ids, batch.attention_mask, batch.token_type_ids, trace=trace)
    el = net.last_exit_layer
    assert (el < 6).any()
    for i, shape in trace:  # layer i (0-based) sees exactly the rows that have not exited
        assert shape[0] == int((el > i).sum())
    assert len(trace) == min(6, int(el.max()))  # no layer runs once every row has exited
    assert trace[0][1][0] == 16


def test_batched_matches_single_examples(built, batch):
    net = built[0].module
    out = np.array(net(batch.input_ids, batch.attention_mask, batch.token_type_ids))
    layers = net.last_exit_layer.copy()
    for i in range(0, 16, 5):
        n = int(batch.attention_mask[i].sum().item())
        one = np.array(net(batch.input_ids[i:i + 1, :n], batch.attention_mask[i:i + 1, :n],
                           batch.token_type_ids[i:i + 1, :n]))
        np.testing.assert_allclose(one[0], out[i], rtol=1e-4, atol=1e-4)
        assert net.last_exit_layer[0] == layers[i]


def test_info_reports_cost_histogram_and_near_ties(built, splits):
    _, info, cache = built
    assert info["threshold_fitted_on"] == "calibration"
    assert info["calibration_agreement"] >= 0.95
    assert sum(info["exit_histogram"].values()) == len(splits["calibration"])
    assert info["ideal_speedup"] == pytest.approx(1 / info["expected_cost"])
    assert list((cache / "exit_heads").glob("*.npz"))  # heads cached


def test_thresholds_use_calibration_split_only(model, splits, tmp_path, monkeypatch):
    seen = []
    real_prepare = type(model).prepare

    def spy(self, taskset, batch_size=32):
        seen.append(taskset.fingerprint())
        return real_prepare(self, taskset, batch_size)

    monkeypatch.setattr(type(model), "prepare", spy)
    _, info = ee.build(model, ExitConfig("margin", target=0.9), calibration=splits["calibration"],
                       cache_dir=tmp_path, fit=splits["fit"])
    assert splits["eval"].fingerprint() not in seen
    assert set(seen) <= {splits["fit"].fingerprint(), splits["calibration"].fingerprint()}
    assert info["n_calibration"] == len(splits["calibration"])


def test_fit_threshold_picks_cheapest_meeting_target():
    rng = np.random.default_rng(0)
    final = rng.normal(size=(200, 3)) * 3
    ref = final.argmax(1)
    heads = [final + rng.normal(size=final.shape) * s for s in (3.0, 1.0)]
    t, agree, cost = ee.fit_threshold(heads, final, ref, "entropy", 0.95, (1, 2), 3)
    assert agree >= 0.95
    el, lg = ee.simulate(heads, final, "entropy", t, (1, 2), 3)
    assert el.mean() / 3 == pytest.approx(cost) and cost < 1
    assert ee.fit_threshold(heads, final, ref, "patience", 1.0, (1, 2), 3)[0] == 3.0  # never


def test_choice_model_is_refused(checkpoint, splits):
    with pytest.raises(ValueError, match="early exit supports decision models with a linear head"):
        ee.build(choice.build(checkpoint), ExitConfig(), calibration=splits["calibration"])


def test_fixed_threshold_that_never_fires_on_calibration(model, splits, tmp_path):
    with pytest.raises(ValueError, match=r"exit_threshold=1e-09 \(entropy\) fires on none"):
        ee.build(model, ExitConfig("entropy", target=None, threshold=1e-9),
                 calibration=splits["calibration"], cache_dir=tmp_path, fit=splits["fit"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(rule="oracle"), "exit rule 'oracle' is not known"),
    (dict(target=1.5), r"exit_target=1.5 is outside \(0, 1\]"),
    (dict(target=None, threshold=0.0), r"exit_threshold=0.0 for rule entropy is outside"),
    (dict(rule="margin", target=None, threshold=1.0), "for rule margin is outside"),
    (dict(rule="patience", target=None, threshold=1), "must be an integer >= 2"),
    (dict(target=None), "give exactly one of exit_target"),
])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExitConfig(**kwargs)


def test_names_encode_parameters():
    names = [c.name for c in ee.ladder(exit_targets=[0.99], exit_bits=[None, 4])]
    assert names[:2] == ["exit-entropy-ag0.99", "exit-entropy-ag0.99-q4"]
    assert ExitConfig("patience", None, 3, exit_layers=(2, 4), label_mix=0.3).name == \
        "exit-patience-t3-h2.4-mix0.30"


@pytest.mark.parametrize("args, message", [
    (["--exit-layers", "6"], "exit_layers [6] are outside [1, 6)"),
    (["--exit-rules", "patience", "--exit-thresholds", "9"], "exceeds the 5 exit heads"),
    (["--exit-thresholds", "0"], "exit_threshold=0.0 for rule entropy is outside (0, 1]"),
    (["--exit-targets", "1.2"], "exit_target=1.2 is outside (0, 1]"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main(["sweep", "--family", "exit", "--results-dir", str(tmp_path / "r"),
                 "--n-fit", "20", "--n-calibration", "20", "--n-eval", "20", "--no-progress",
                 *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "r").exists()
