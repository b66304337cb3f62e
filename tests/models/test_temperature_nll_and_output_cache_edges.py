"""Edges found by trying to break the corrupt-file and metric-edge checks: non-finite logits in a temperature fit, a
negative-zero NLL, and reference outputs cached under another batch size."""

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy.special import softmax

from metrics.from_logits import nll_column
from metrics.temperature_fit import fit_calibration_temperature, fit_temperature, fit_temperature_status

FINITE = np.array([[3.0, 0.0], [0.0, 2.0], [1.0, 4.0], [2.0, 1.0]])
LABELS = np.array([0, 1, 0, 1])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_temperature_fit_on_non_finite_logits_is_not_a_number(bad):
    z = FINITE.copy()
    z[0, 1] = bad
    m = np.ones_like(z, bool)
    fit = fit_temperature_status(z, m, LABELS)
    # before: T = 0.001 ("converged"-looking number from a NaN objective, or "separable data")
    assert fit.status == "not_converged" and math.isnan(fit.temperature)
    assert "NaN or inf" in fit.reason
    refit = fit_temperature(z, m, LABELS)
    assert math.isnan(refit.temperature) and refit.n == 4
    with pytest.warns(UserWarning, match="NaN or inf"):
        res = fit_calibration_temperature(z, m, LABELS)
    assert res.temperature == 1.0 and "T = 1 used" in res.reason
    # a non-finite logit outside the mask is ignored: same fit as the finite logits
    m2 = m.copy()
    m2[0, 1] = False
    z2 = FINITE.copy()
    z2[0, 1] = 0.0
    assert fit_temperature_status(z, m2, LABELS) == fit_temperature_status(z2, m2, LABELS)


def test_nll_of_a_certain_target_is_plus_zero():
    logits = np.array([[1e6, 0.0], [0.0, 1e6]])
    probs = softmax(logits, axis=1).astype(np.float32)
    nll = nll_column(logits.astype(np.float32), probs, np.array([0, 0]), np.ones((2, 2), bool),
                     np.ones(2))
    assert nll[1] == 1e6
    assert nll[0] == 0.0 and not np.signbit(nll[0])  # was -0.0 ("-0.0000" in a report)


def test_prepared_digest_changes_with_the_batch_size(checkpoint):
    from variants.datasets import bundled as data
    from variants.models.decision import prepared_digest
    from variants.models import sentiment

    model = sentiment.build(checkpoint)
    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 12, seed=0)
    ts = sentiment.make_taskset(frame)
    b4, b8a, b8b = (model.prepare(ts, n)[0] for n in (4, 8, 8))
    assert prepared_digest(b8a) == prepared_digest(b8b)
    assert prepared_digest(b4) != prepared_digest(b8a)
    # the logits of one text really move with the padding of its batch (so the cache key must)
    pos4 = {int(i): (k, j) for k, b in enumerate(b4) for j, i in enumerate(b.index)}
    pos8 = {int(i): (k, j) for k, b in enumerate(b8a) for j, i in enumerate(b8a[k].index)}
    shapes = {i: (b4[pos4[i][0]].input_ids.shape[1], b8a[pos8[i][0]].input_ids.shape[1])
              for i in pos4}
    assert any(a != b for a, b in shapes.values())  # some text is padded differently


def test_reference_outputs_cached_at_batch_32_are_not_reused_at_batch_4(checkpoint, tmp_path):
    """Sweep.reference with --batch-size 32, again with 32 (from the cache), then with 4: the
    reference outputs are recomputed (a key without the batch size reused them) and differ."""
    from variants.datasets import bundled as data
    from variants.models import sentiment
    from variants.sweep.run import Sweep, SweepClock, SweepConfig

    frame = data.load_vader()
    tasksets = {s: sentiment.make_taskset(data.sample(data.split_frame(frame, s), n))
                for s, n in (("fit", 40), ("calibration", 20), ("eval", 12))}

    def run(batch_size, run_name):
        cfg = SweepConfig(results_dir=str(tmp_path), run=run_name, n_fit=40, n_calibration=20,
                          n_eval=12, progress=False, cold_start="none", batch_size=batch_size,
                          timing_batch_sizes=(1,)).validate()
        sw = Sweep(cfg, log=lambda m: None)
        sw.checkpoint, sw.tasksets, sw.clock = checkpoint, tasksets, SweepClock()
        sw.reference()
        return sw

    first, again, small = run(32, "a"), run(32, "b"), run(4, "c")
    assert first.ref_outputs_cached == {"calibration": False, "eval": False}
    assert again.ref_outputs_cached == {"calibration": True, "eval": True}
    assert small.ref_outputs_cached == {"calibration": False, "eval": False}
    assert small.head_key == first.head_key  # the head does not depend on --batch-size
    a, b = first.ref_outputs["eval"].logits, small.ref_outputs["eval"].logits
    np.testing.assert_allclose(a, b, atol=1e-4)  # same numbers up to float rounding ...
    cached = [p.name for p in (tmp_path / ".cache" / "reference").iterdir()]
    assert len([n for n in cached if "-plain-" not in n]) == 4  # ... cached apart


def test_a_huge_or_multiline_clause_id_or_contract_name_is_refused_in_one_short_line():
    from contracts.checker import MAX_LABEL, ContractError, contract_from_dict

    def contract(cid="a", name="c"):
        return {"name": name, "clause": [{"id": cid, "metric": "flip", "statistic": "rate",
                                          "max": 0.1}]}

    assert contract_from_dict(contract("x" * MAX_LABEL)).clauses[0].id == "x" * MAX_LABEL
    assert contract_from_dict(contract(name="n" * MAX_LABEL)).name == "n" * MAX_LABEL
    # before: a 50 MB id was accepted and printed twice per variant (100 MB on stdout)
    for bad in (contract("x" * 5_000_000), contract("two\nlines"), contract(name="n" * 5_000_000),
                contract(name="a\x1b[2Jb")):
        with pytest.raises(ContractError) as e:
            contract_from_dict(bad, source="c.toml")
        msg = str(e.value)
        assert len(msg) < 400 and "\n" not in msg and msg.startswith("c.toml: ")
        assert f"at most {MAX_LABEL} characters" in msg


def test_accuracy_drop_interval_is_honest_with_no_flip_either_way():
    """Strict's `accuracy-drop` clause compares the upper CI bound with 0.02: with identical
    outputs on 20 labelled examples the bootstrap gave [0, 0] and it passed. Tango's paired
    score interval (issue #38; before it a Bonferroni pair of Clopper-Pearson intervals, +-0.197)
    gives +-z^2/(n + z^2) = +-0.161 at b = c = 0 (Z(d) = -sqrt(n d / (1 - d)) there) and the
    clause fails."""
    from scipy.stats import norm

    from contracts.checker import check, contract_from_dict
    from metrics.evaluate import evaluate
    from metrics.paired import tango_interval

    rng = np.random.default_rng(0)
    z = rng.normal(size=(20, 3))
    probs = softmax(z, axis=1)
    out = {"ids": np.array([f"e{i}" for i in range(20)]), "task": np.array(["t"] * 20),
           "logits": z.astype(np.float32), "option_mask": np.ones((20, 3), bool),
           "probs": probs.astype(np.float32), "temperature": np.ones(20, np.float32),
           "expected_score": np.full(20, np.nan, np.float32),
           "action_probs": np.stack([probs[:, 0], 1 - probs[:, 0]], 1).astype(np.float32),
           "labels": rng.integers(0, 3, size=20)}
    ev = evaluate(out, out, epsilon=0.0)
    q = norm.ppf(0.975) ** 2
    upper = q / (20 + q)
    assert upper == pytest.approx(0.16113, abs=1e-5)
    assert ev.value("accuracy_drop") == 0.0
    assert ev.ci("accuracy_drop") == (pytest.approx(-upper, rel=1e-12),
                                      pytest.approx(upper, rel=1e-12))
    assert ev.interval_method("accuracy_drop") == "tango-paired-score"
    contract = contract_from_dict({"name": "c", "clause": [
        {"id": "accuracy-drop", "metric": "accuracy_drop", "max": 0.02, "compare": "ci"}]})
    r = check(contract, ev, n_bootstrap=200).results[0]
    assert r.passed is False and r.interval == "tango-paired-score"
    assert (r.ci_low, r.ci_high) == ev.ci("accuracy_drop")
    with pytest.raises(ValueError, match="b \\+ c <= n"):
        tango_interval(30, 20, 40)


def _copy_fixture(tmp_path, name="sweep_small"):
    import shutil

    dst = tmp_path / name
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / name, dst)
    return dst


def test_check_in_place_never_leaves_a_complete_run_of_mixed_files(tmp_path, monkeypatch, capsys):
    """Break-test: a check that failed midway left new metrics.json beside old verdict.json while
    run.json still said "complete". Now: "incomplete" with the error; a clean check keeps the
    status it found."""
    import errno
    import json

    from runs import io as runs_io
    from variants.cli import main

    run = _copy_fixture(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    meta["status"] = status = "complete"  # the fixture predates run.json's status
    (run / "run.json").write_text(json.dumps(meta))
    assert main(["check", str(run)]) == 0
    assert json.loads((run / "run.json").read_text()) == meta  # a clean check changes nothing
    real = runs_io._atomic

    def full(path, write, mode):
        if str(path).endswith("q4-g64/verdict.json"):
            raise runs_io.WriteError(path, OSError(errno.ENOSPC, "No space left on device"))
        return real(path, write, mode)

    monkeypatch.setattr(runs_io, "_atomic", full)
    assert main(["check", str(run)]) == 1
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "incomplete" and meta["status_before_check"] == status
    assert "q4-g64/verdict.json" in meta["check_error"]["file"]
    assert "q4-g64/verdict.json" in capsys.readouterr().err
    monkeypatch.setattr(runs_io, "_atomic", real)
    assert main(["check", str(run)]) == 0  # rerunning finishes it
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == status and "check_error" not in meta
    assert "status_before_check" not in meta
