"""The judged model is the model that runs (variants.sweep.timed_check, families.family.judged_mode):
W8A8 judged on its native build with the int8 scheme recorded; a variant judged in simulated
mode checked against its timed native build on every eval row, and refused in one line when
they differ beyond the tolerance; folders of an earlier version judged again on resume, a
timing of another int8 scheme timed again; a CPU with no exact int8 scheme runs W8A8
simulated, saying so."""

import json

import numpy as np
import pandas as pd
import pytest

from variants.cli import main
from variants.runtime import int8_linear
from variants.sweep import timed_check

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "1", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]


class _Out:
    def __init__(self, logits, ids=None, mask=None):
        self.logits = np.asarray(logits, np.float32)
        self.ids = np.asarray(ids if ids is not None else [str(i) for i in range(len(logits))])
        self.option_mask = (np.ones_like(self.logits, bool) if mask is None
                            else np.asarray(mask, bool))


def test_compare_hand_computed():
    a = _Out([[1.0, 2.0, 0.0], [0.5, 0.4, 9.0]], mask=[[1, 1, 0], [1, 1, 0]])
    b = _Out([[1.0, 2.00005, 7.0], [0.4, 0.5, -9.0]], mask=[[1, 1, 0], [1, 1, 0]])
    res = timed_check.compare(a, b)
    # masked options ignored (7 vs 0, -9 vs 9); row 1's top option moved: 0.1 apart
    assert res["rows"] == 2 and res["label_changes"] == 1
    assert res["max_abs_dlogit"] == pytest.approx(0.1, abs=1e-6)
    with pytest.raises(ValueError, match="not the judged rows"):
        timed_check.compare(a, _Out(b.logits, ids=["x", "y"]))
    # the tolerance scales with the logits (masked options ignored), at least 1e-4
    assert timed_check.tolerance(a) == pytest.approx(2e-4)
    assert timed_check.tolerance(_Out([[0.3, -0.2]])) == pytest.approx(1e-4)
    assert timed_check.tolerance(_Out([[7.0, -9.0]])) == pytest.approx(9e-4)


@pytest.fixture(scope="module")
def w8a8_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("w8a8")
    assert main(["sweep", "--family", "w8a8", "--smooth", "off", *TINY,
                 "--results-dir", str(root)]) == 0
    return next(root.glob("minilm-sentiment-w8a8*"))


def test_the_sweep_says_when_it_judges_in_the_speed_mode(tmp_path):
    """--quality-mode simulated (the default) with W8A8: the sweep says in one line that it
    judges native instead; with --quality-mode equal to --speed-mode it says nothing."""
    from variants.sweep.config import SweepConfig
    from variants.sweep.run import Sweep

    cfg = SweepConfig(family="w8a8", params={"smooth": ["off"]}, n_fit=60, n_calibration=40,
                      n_eval=40, results_dir=str(tmp_path), progress=False).validate()
    assert cfg.quality_mode == "native"
    said = []
    Sweep(cfg, log=said.append).prepare()
    assert said == ["quality judged in native mode, not simulated: every variant here has W8A8 "
                    "Linears, judged on the model that runs (--speed-mode)"]
    cfg = SweepConfig(family="w8a8", params={"smooth": ["off"]}, quality_mode="native",
                      n_fit=60, n_calibration=40, n_eval=40, results_dir=str(tmp_path),
                      progress=False).validate()
    said = []
    Sweep(cfg, log=said.append).prepare()
    assert said == []


def test_report_line_counts_checked_unchecked_and_same():
    from runs.report_facts import judged_lines as _judged_text

    summary = pd.DataFrame({"variant": ["a", "b", "c"], "quality_mode": ["simulated"] * 3,
                            "speed_mode": ["native"] * 3,
                            "timed_check_max_dlogit": [2e-6, 4e-6, None],
                            "timed_check_tolerance": [1e-4, 1e-4, None]})
    assert _judged_text(summary) == [
        "- judged model = timed model: 2 judged in simulated mode, their timed (native) build "
        "checked equal on every eval row (max |Δlogit| 4e-06 <= 0.0001); 1 judged in simulated "
        "mode without a check of their timed build (c: written by an earlier version; rerun "
        "the sweep to check them)"]
    same = summary.assign(quality_mode="native")
    assert _judged_text(same) == ["- judged model = timed model: 3 judged on the timed (native) "
                                  "model itself"]


def test_w8a8_is_judged_on_the_model_that_runs_and_records_its_scheme(w8a8_run):
    build = json.loads((w8a8_run / "w8a8" / "build.json").read_text())
    timing = json.loads((w8a8_run / "w8a8" / "timing.json").read_text())
    native = int8_linear._kernel() is not None
    assert build["quality_mode"] == "native" == timing["mode"]
    assert build["timed_check"] == {"same_model": True, "judged_mode": "native",
                                    "timed_mode": "native"}
    if native:
        rec = {"scheme": int8_linear.scheme(), "isa": int8_linear.cpu_isa()}
        assert rec["scheme"] in ("u8s8", "u8s8-split7")
        assert build["int8"] == rec and timing["int8"] == rec
        assert "dnnl" in build["kernel"] and "dnnl" in timing["kernel"]["variant"]
    else:
        assert build["int8"] is None and build["kernel"] == "w8a8-simulated"
    summary = pd.read_csv(w8a8_run / "summary.csv")
    assert summary["quality_mode"].tolist() == ["native"]
    report = (w8a8_run / "report.md").read_text()
    assert "- judged model = timed model: 1 judged on the timed (native) model itself" in report
    # the run's own quality mode is the speed mode (every variant judged in it): run.json, the
    # report's header and the run's identity (an old folder judged simulated is not resumed)
    meta = json.loads((w8a8_run / "run.json").read_text())
    assert meta["config"]["quality_mode"] == "native" == meta["identity"]["quality_mode"]
    assert "- quality numbers: `native` mode; speed numbers: `native` mode" in report


def test_a_w8a8_folder_judged_simulated_is_not_resumed(w8a8_run, tmp_path, capsys):
    """A W8A8 run folder whose identity says quality simulated (an earlier version judged it
    there) is refused in one line naming why, not resumed on its simulated verdicts."""
    import shutil

    run = tmp_path / "old"
    shutil.copytree(w8a8_run.parent, run)
    folder = next(run.glob("minilm-sentiment-w8a8*"))
    meta = json.loads((folder / "run.json").read_text())
    meta["identity"]["quality_mode"] = "simulated"
    (folder / "run.json").write_text(json.dumps(meta))
    assert main(["sweep", "--family", "w8a8", "--smooth", "off", *TINY,
                 "--results-dir", str(run)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = lines[-1]
    assert err.startswith(f"variants: error: {folder} holds a sweep with other settings "
                          "{'quality_mode': ('simulated', 'native')} (old, new) (its variants "
                          "are judged on the model they time, in native mode: W8A8 Linears; "
                          "that folder judged them otherwise); choose another --run name")
    assert len(lines) == 1


def test_a_timing_of_another_int8_scheme_is_timed_again(w8a8_run, tmp_path, capsys):
    """A resumed W8A8 folder timed with another scheme / ISA (e.g. made on a CPU without VNNI):
    every batch size is timed again on this CPU's scheme, even with none missing."""
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(w8a8_run.parent, run)
    t = next(run.glob("minilm-sentiment-w8a8*")) / "w8a8" / "timing.json"
    timing = json.loads(t.read_text())
    timing["int8"] = {"scheme": "other", "isa": "elsewhere"}
    t.write_text(json.dumps(timing))
    # the same batch sizes: nothing is missing, the saved times are still another kernel's
    assert main(["sweep", "--family", "w8a8", "--smooth", "off", *TINY,
                 "--results-dir", str(run)]) == 0
    err = capsys.readouterr().err
    assert "w8a8: timed with int8 {'scheme': 'other', 'isa': 'elsewhere'}, now " in err
    assert "timing every batch size again" in err
    now = json.loads(t.read_text())
    want = ({"scheme": int8_linear.scheme(), "isa": int8_linear.cpu_isa()}
            if int8_linear._kernel() is not None else None)
    assert now["int8"] == want
    assert sorted(now["batches"]) == ["1"] and sorted(now["end_to_end"]) == ["1"]
    assert now["batches"]["1"] != timing["batches"]["1"]  # measured again


def test_simulated_quality_is_checked_against_the_timed_build(tmp_path):
    assert main(["sweep", "--bits", "4", *TINY, "--results-dir", str(tmp_path)]) == 0
    run = next(tmp_path.glob("minilm-sentiment-quant*"))
    check = json.loads((run / "q4-g64" / "build.json").read_text())["timed_check"]
    assert check["judged_mode"] == "simulated" and check["timed_mode"] == "native"
    assert check["rows"] == 40 and check["ok"] is True and check["label_changes"] == 0
    # packed weights dequantized in the kernel against MLX's dequantize: float32 round-off
    assert 0 <= check["max_abs_dlogit"] <= check["tolerance"]
    out = np.load(run / "q4-g64" / "outputs.npz")
    scale = np.abs(out["logits"][out["option_mask"]]).max()
    assert check["tolerance"] == pytest.approx(timed_check.TOLERANCE * max(1.0, scale))
    summary = pd.read_csv(run / "summary.csv")
    assert summary["timed_check_max_dlogit"].iloc[0] == pytest.approx(check["max_abs_dlogit"])
    assert "their timed (native) build checked equal on every eval row" in \
        (run / "report.md").read_text()


def test_a_folder_of_an_earlier_version_is_judged_again(tmp_path, capsys):
    """A variant folder judged in simulated mode with no timed check (written before the check
    existed) is built, judged and timed again on resume, not reused."""
    assert main(["sweep", "--bits", "8", *TINY, "--results-dir", str(tmp_path)]) == 0
    b = next(tmp_path.glob("minilm-sentiment-quant*")) / "q8-g64" / "build.json"
    build = json.loads(b.read_text())
    del build["timed_check"]
    b.write_text(json.dumps(build))
    capsys.readouterr()
    assert main(["sweep", "--bits", "8", *TINY, "--results-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert ("q8-g64: its timed build was never checked against the judged one (an earlier "
            "version); building, judging and timing it again") in err
    assert "reusing them (resume)" not in err
    assert json.loads(b.read_text())["timed_check"]["ok"] is True


def test_a_timed_model_that_differs_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """The native build made to differ (its head bias moved by 1e-2): the variant is left out,
    named in one line with the difference and the fix; nothing of it is written."""
    from variants.families.quant import dispatch

    real = dispatch.build_weights

    def shifted(reference, config, inputs, mode):
        model, info = real(reference, config, inputs, mode)
        if mode == "native":
            head = model.module.head
            head.bias = head.bias + 1e-2
        return model, info

    monkeypatch.setattr(dispatch, "build_weights", shifted)
    code = main(["sweep", "--bits", "8", *TINY, "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0
    line = next(ln for ln in err.splitlines() if "q8-g64: FAILED" in ln)
    assert "the timed (native) model is not the judged (simulated) one: max |Δlogit| 0.01" in line
    # the tolerance: 1e-4 x the judged logits' scale (this head's max |logit|, a few units)
    tol = float(line.split(" > ")[1].split(" on 40 eval rows")[0])
    assert 1e-4 < tol < 2e-3
    assert "--quality-mode native (in a new --run or --results-dir)" in line
    run = next(tmp_path.glob("minilm-sentiment-quant*"))
    assert not (run / "q8-g64").exists()


def test_no_exact_scheme_runs_w8a8_simulated_and_says_so(monkeypatch, capsys, checkpoint):
    """A CPU whose oneDNN sums came back wrong even split (int8_scheme() == "none"): the compiled
    int8 ops are refused, so nothing judges or times a model that computes other sums."""
    from variants.families.w8a8 import build as w8a8
    from variants.families.w8a8.family import W8A8Config
    from variants.models import sentiment
    from variants.runtime import qkernel

    k = qkernel.load()
    if k is None or not k.has_dnnl():
        pytest.skip("the compiled int8 GEMM is unavailable here")

    class NoScheme:
        def __getattr__(self, name):
            return getattr(k, name)

        def int8_scheme(self):
            return "none"

    monkeypatch.setattr(qkernel, "load", lambda: NoScheme())
    monkeypatch.setitem(w8a8._warned, "done", False)
    assert int8_linear._kernel() is None and int8_linear.scheme() is None
    v, info = w8a8.build(sentiment.build(checkpoint), W8A8Config(), mode="native")
    err = capsys.readouterr().err
    assert info["kernel"] == "w8a8-simulated" and info["simulated_speed"] and info["int8"] is None
    assert err.strip() == ("variants: w8a8 runs simulated (fake-quantized fp32): oneDNN's int8 "
                           f"GEMM gives no exact sums on this CPU ({k.int8_cpu_isa()})")


def test_a_w8a8_search_of_an_earlier_version_is_not_resumed(tmp_path):
    """A --w8a8 search stores its candidates' verdicts; one written before int8 candidates were
    judged on their native build (no ``int8_judged`` in search_settings.json) is refused, the
    absent setting said as its plain value."""
    from variants.search.options import PLAIN, SearchOptions
    from variants.search.store import Store

    store = Store(tmp_path)
    old = dict(SearchOptions().settings(), w8a8=True)
    store.write_settings(old)
    with pytest.raises(ValueError, match="holds a search with int8_judged='simulated', not "
                                         "'native'; rerun with the same settings"):
        store.check_settings(dict(old, int8_judged="native"), plain=PLAIN)
    store.check_settings(old, plain=PLAIN)  # the same settings resume
    assert "int8_judged" not in SearchOptions().settings()  # not an option: the driver's
