"""Issue #40, item 4: a run judged on unlabelled rows with flips renders its report.html and
exports with its model card (the flipped rows listed, "unlabelled", no label shown); a report
that cannot render fails the sweep with one line (exit 1, run.json incomplete).

The model: tests/fixtures/hf/bert (random init, BertForSequenceClassification) with its
classifier made decisive, so that a 2-bit variant flips rows: weights x 30 and the bias
centred on the median logits of the texts, so each option is the top one on some rows (the
committed head puts every text on "positive" by a margin of about 0.2)."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.html  # the real report.html writer

REPO = Path(__file__).resolve().parents[2]
N_TEXTS = 200
SWEEP = ["--bits", "2", "--timing-rounds", "1", "--timing-warmup", "0", "--timing-budget-s",
         "0.5", "--timing-batch-sizes", "1", "--cold-start", "none", "--no-progress"]


def _decisive_bert(dst, texts, scale=30.0):
    """Copy of the fixture BERT with ``classifier`` = scale x weight and bias -median(scale x
    W h) over ``texts``; returns its model TOML and the count of texts per top option."""
    from safetensors.numpy import load_file, save_file

    from variants.checkpoints.load import load_checkpoint
    from variants.datasets import own
    from variants.models import resolve

    shutil.copytree(REPO / "tests" / "fixtures" / "hf" / "bert", dst)
    toml = dst / "model.toml"
    toml.write_text(f'name = "decisive-bert"\nlogits = "classifier"\ncheckpoint = "{dst}"\n')
    source = resolve(model_config=toml)
    model = source.build(load_checkpoint(dst))  # (the options come from its id2label)
    rows = dst / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": t, "split": "eval"}) + "\n" for t in texts))
    fixed = dict(zip(("options", "scores", "actions"), source.fixed_options() or (None,) * 3))
    ts = own.to_taskset(own.read_data(rows, require_splits=(), **fixed), **fixed)
    logits = np.asarray(model.raw_logits(ts))
    t = load_file(dst / "model.safetensors")
    wh = scale * (logits - t["classifier.bias"])
    t["classifier.weight"] = (scale * t["classifier.weight"]).astype(np.float32)
    t["classifier.bias"] = (-np.median(wh, axis=0)).astype(np.float32)
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    return toml, np.bincount((wh + t["classifier.bias"]).argmax(1), minlength=3)


@pytest.fixture(scope="module")
def unlabelled_run(tmp_path_factory):
    """(results root, run folder, data file, model TOML): a 2-bit sweep of the decisive BERT on
    200 VADER tweets given as text only (no label column)."""
    from variants.cli import main

    root = tmp_path_factory.mktemp("unlabelled")
    lines = (REPO / "data" / "vader" / "tweets_GroundTruth.txt").read_text(
        encoding="utf-8", errors="replace").splitlines()
    texts = [line.split("\t")[2] for line in lines[:N_TEXTS]]
    toml, tops = _decisive_bert(root / "bert", texts)
    assert tops.min() >= 20, tops  # every option is the reference's answer on some texts
    data = root / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert main(["sweep", "--model-config", str(toml), "--data", str(data), *SWEEP,
                 "--results-dir", str(root / "results"), "--run", "u"]) == 0
    return root / "results", root / "results" / "u", data, toml


def test_unlabelled_flips_render_in_report_html(unlabelled_run):
    _, run, _, _ = unlabelled_run
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    (v,) = report["variants"]
    ref = np.load(run / "reference" / "outputs.npz")
    var = np.load(run / v["name"] / "outputs.npz")
    assert (ref["labels"] == -1).all()  # no label anywhere
    flipped = np.flatnonzero(ref["probs"].argmax(1) != var["probs"].argmax(1))
    assert v["n_flipped"] == flipped.size > 0
    assert [e["row"] for e in v["flipped"]] == flipped[:20].tolist()
    assert {e["kind"] for e in v["flipped"]} == {"unlabelled"}
    assert all(e["label"] == -1 and e["ref_top"] != e["var_top"] for e in v["flipped"])
    page = (run / "report.html").read_text(encoding="utf-8")
    table = re.search(r'<table class="sortable flipped"[^>]*>(.*?)</table>', page, re.S)
    assert table and table.group(1).count("<tr>") == 1 + len(v["flipped"])  # header + rows
    assert table.group(1).count("<td>unlabelled</td>") == len(v["flipped"])


def test_unlabelled_flips_export_with_their_model_card(unlabelled_run, tmp_path, capsys):
    from variants.cli import main

    _, run, _, _ = unlabelled_run
    name = json.loads((run / "report.json").read_text(encoding="utf-8"))["variants"][0]["name"]
    out = tmp_path / "exported"
    assert main(["export", str(run), "--variant", name, "--out", str(out), "--allow-fail"]) == 0
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "## Contract clauses" in card and f"— {name} (quant)" in card
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert [v["name"] for v in report["variants"]] == [name]
    assert report["variants"][0]["flipped"] == json.loads(
        (run / "report.json").read_text(encoding="utf-8"))["variants"][0]["flipped"]
    page = (out / "report.html").read_text(encoding="utf-8")
    first = report["variants"][0]["flipped"][0]
    assert f'<td class="mono">{first["id"]}</td>' in page
    assert "report.html" in json.loads((out / "manifest.json").read_text())["files"]


def test_a_report_that_cannot_render_fails_the_sweep_in_one_line(unlabelled_run, tmp_path,
                                                                 capsys, monkeypatch):
    """Rerun of a copy of the run with the page renderer broken: exit 1, one line naming
    report.html and the error, run.json incomplete, report.md still written."""
    import runs.html.render as render
    from variants.cli import main

    results, _, data, toml = unlabelled_run
    root = tmp_path / "results"
    shutil.copytree(results, root)

    def broken(data, charts=None):
        raise TypeError("planted rendering bug")

    monkeypatch.setattr(render, "render_html", broken)
    (root / "u" / "report.html").unlink()
    capsys.readouterr()
    assert main(["sweep", "--model-config", str(toml), "--data", str(data), *SWEEP,
                 "--results-dir", str(root), "--run", "u"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"variants: error: {root / 'u' / 'report.html'} not written (TypeError: "
                       "planted rendering bug); run.json says incomplete. Rerun the same "
                       "command to retry, or report the error")
    assert not any("not written" in line for line in err[:-1])  # said once, as the error
    meta = json.loads((root / "u" / "run.json").read_text())
    assert meta["status"] == "incomplete" and "planted rendering bug" in meta["error"]["error"]
    assert (root / "u" / "report.md").is_file() and not (root / "u" / "report.html").exists()


def test_model_card_renders_the_nulls_a_run_may_hold():
    """timing.json allows null times and speed-ups (a time too short for the clock), verdict.json
    null values (a clause with no examples), build.json may lack model_bytes: each shows "—"."""
    from variants.export.card import markdown

    facts = {"name": "q4-g64", "family": "quant", "model": "m", "contract": "default",
             "n_eval": 40, "search": None, "bytes": 2_000_000, "quantization": None,
             "lowrank": None, "build": {"bits_per_weight": None},
             "verdict": {"passed": True, "clauses": [
                 {"id": "negative-flips", "value": None, "op": "<=", "threshold": 0.02,
                  "ci_low": None, "ci_high": None, "status": "no examples"}],
                 "untested": ["negative-flips"]},
             "timing": {"device": "cpu", "mode": "native", "batches": {
                 "1": {"seq_len": 12, "ref": {"p50_ms": 2.0}, "var": {"p50_ms": None},
                       "speedup": None},
                 "32": {"seq_len": 12, "ref": {"p50_ms": 8.0}, "var": {"p50_ms": 4.0},
                        "speedup": {"speedup_median": 2.0, "speedup_ci_low": 1.5,
                                    "speedup_ci_high": float("nan")}}}}}
    card = markdown(facts)
    assert "model bytes as judged — MB" in card and "stored bits per quantized weight: —" in card
    assert "| negative-flips | — | <= 0.02 | — | no examples |" in card
    assert "| 1 (L=12) | 2.0 | — | — [—, —] |" in card
    assert "| 32 (L=12) | 8.0 | 4.0 | 2.00× [1.50, —] |" in card
    assert "clauses with no examples or skipped: negative-flips" in card


def test_report_timing_block_takes_a_null_speedup():
    from runs.html.build import _timing

    ref_ms = [2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7]
    t = _timing({"mode": "native", "batches": {"1": {"seq_len": 12, "rounds": 8, "speedup": None,
                                                       "ref_ms": ref_ms, "var_ms": ref_ms}}})
    (entry,) = t["forward"]
    assert entry["speedup"] is None and entry["speedup_ci"] == [None, None]
    # the times are still shown: the median's 95% order-statistic interval of 8 rounds is the
    # 1st to the 8th (P(at most 1 of 8 below the median) = 9/256 > 0.025)
    assert entry["B"] == 1 and entry["ref"]["p50_ci"] == [2.0, 2.7]
