"""report.html: valid HTML5, nothing fetched, the embedded JSON equal to report.json, every
section in order, one clause row per clause with the right margin (no browser; see
tests/runs/test_html_browser.py for Chromium)."""

import json
import re
import numpy as np
import pandas as pd
import pytest

from runs.html.data import clause_rows, contract_digest, flipped_examples
from browser import SECTIONS, ReportDom
from runs.html.render import embedded_json, render_html

pytestmark = pytest.mark.html

@pytest.fixture(scope="module")
def page(html_sweep_small):
    html = (html_sweep_small / "report.html").read_text(encoding="utf-8")
    p = ReportDom()
    p.feed(html)
    return html, p, json.loads((html_sweep_small / "report.json").read_text(encoding="utf-8"))


def test_valid_html5(page):
    import html5lib

    html, _, _ = page
    parser = html5lib.HTMLParser(strict=True)  # raises on any HTML5 parse error
    parser.parse(html)
    assert parser.errors == []


def test_nothing_fetched(page):
    html, p, _ = page
    assert not re.search(r"https?://", html, re.I)
    assert all(link.startswith("#") for link in p.links), p.links
    assert "<link" not in html and "@import" not in html
    assert re.findall(r"url\(([^)]*)\)", html) and all(  # SVG clip paths: local fragments only
        u.startswith("#") for u in re.findall(r"url\(([^)]*)\)", html))


def test_embedded_json_equals_report_json(page):
    _, p, data = page
    assert json.loads(p.data) == data
    assert data["kind"] == "run-report" and [v["name"] for v in data["variants"]] == [
        "q2-g64", "q4-g64", "q8-g64"]  # summary.csv order


def test_sections_in_order_and_one_row_per_clause(page):
    _, p, data = page
    assert p.sections == SECTIONS
    for v in data["variants"]:
        assert len(p.clauses[v["name"]]) == len(v["clauses"]) == 17  # finite-outputs too
        statuses = [c["status"] for c in v["clauses"]]
        fails = statuses.count("FAIL")
        assert statuses[:fails] == ["FAIL"] * fails  # failures first
        assert fails == len(v["failed"])


def test_verdicts_and_margins_as_verdict_json(page, html_sweep_small):
    _, _, data = page
    for v in data["variants"]:
        verdict = json.loads((html_sweep_small / v["name"] / "verdict.json").read_text())
        assert v["verdict"] == ("fail" if verdict["failed"] else "pass")
        by_id = {c["id"]: c for c in verdict["clauses"]}
        for c in v["clauses"]:
            ref = by_id[c["id"]]
            want = (ref["value"] - ref["threshold"] if ref["op"] == ">="
                    else ref["threshold"] - ref["value"])
            assert c["margin"] == pytest.approx(want, rel=1e-12, abs=1e-15)
            assert (c["margin"] < 0) == (ref["status"] == "FAIL")


def test_size_and_charts(page):
    html, _, data = page
    assert len(html.encode()) < 1_000_000
    n_svg = html.count("<svg ")
    assert n_svg == 1 + len(data["variants"])  # one Pareto (B=1) + one reliability per variant


def test_clause_rows_order_and_margin():
    verdict = {"clauses": [
        {"id": "a", "value": 0.975, "op": ">=", "threshold": 0.97, "status": "pass", "n": 40},
        {"id": "b", "value": 0.1335, "op": "<=", "threshold": 0.1, "status": "FAIL", "n": 40},
        {"id": "c", "value": None, "op": "<=", "threshold": 0.1, "status": "no examples", "n": 0},
        {"id": "d", "value": 0.3, "op": ">=", "threshold": 0.5, "status": "FAIL", "n": 9}]}
    rows = clause_rows(verdict, settled={"d"})
    assert [r["id"] for r in rows] == ["b", "d", "c", "a"]
    assert [r["margin"] for r in rows] == pytest.approx([-0.0335, -0.2, None, 0.005])
    assert [r["decided_by"] for r in rows] == ["all 40 rows", "sequential stopping",
                                               "all 0 rows", "all 40 rows"]


def test_contract_digest_sees_a_threshold():
    v = {"contract": "x", "settings": {"seed": 0},
         "clauses": [{"id": "a", "metric": "kl", "stratum": "all", "statistic": "p95",
                      "op": "<=", "threshold": 0.05, "compare": "value", "value": 0.01}]}
    w = json.loads(json.dumps(v))
    w["clauses"][0]["value"] = 0.2  # a measured value is not the contract
    assert contract_digest(v) == contract_digest(w)
    w["clauses"][0]["threshold"] = 0.06
    assert contract_digest(v) != contract_digest(w)


def test_flipped_examples_hand_computed():
    logits = np.array([[2.0, 0.5, 0.0], [0.0, 1.0, 3.0], [1.0, 0.0, -9.0]], np.float32)
    var = np.array([[0.2, 1.0, 0.0], [0.0, 1.0, 3.0], [0.0, 1.5, -9.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], bool)

    def soft(z):
        e = np.where(mask, np.exp(z), 0)
        return e / e.sum(1, keepdims=True)

    per = pd.DataFrame({"id": ["a", "b", "c"], "flip": [True, False, True], "label": [0, 2, -1],
                        "negative_flip": [True, False, False],
                        "positive_flip": [False, False, False],
                        "near_tie": [False, False, True], "certified": [True, True, False]})
    rows = flipped_examples({"logits": logits, "probs": soft(logits), "option_mask": mask},
                            {"logits": var, "probs": soft(var), "option_mask": mask}, per,
                            {"a": "  two\nwords "})
    assert [r["id"] for r in rows] == ["a", "c"]
    a, c = rows
    assert (a["ref_top"], a["var_top"], a["text"], a["kind"]) == (0, 1, "two words", "negative")
    assert a["ref_margin"] == pytest.approx(1.5) and a["var_margin"] == pytest.approx(0.8)
    assert a["ref_prob"] == pytest.approx(np.exp(2) / (np.exp(2) + np.exp(.5) + 1), rel=1e-6)
    # the masked option (-9, third) takes no part: margins over the two valid options only
    assert (c["ref_top"], c["var_top"], c["kind"]) == (0, 1, "unlabelled")
    assert c["ref_margin"] == pytest.approx(1.0) and c["var_margin"] == pytest.approx(1.5)
    # as metrics.evaluate makes them: the label-dependent columns are nullable booleans, NA on
    # an unlabelled row (bool(pd.NA) raises); a labelled row both models get wrong is
    # "both wrong" (neither flip kind), not "unlabelled"
    per["label"] = [2, 2, -1]  # row a: reference 0, variant 1, label 2
    for col, vals in (("negative_flip", [False, False, pd.NA]),
                      ("positive_flip", [False, False, pd.NA])):
        per[col] = pd.array(vals, dtype="boolean")
    rows = flipped_examples({"logits": logits, "probs": soft(logits), "option_mask": mask},
                            {"logits": var, "probs": soft(var), "option_mask": mask}, per, {})
    assert [(r["id"], r["label"], r["kind"]) for r in rows] == [("a", 2, "both wrong"),
                                                                  ("c", -1, "unlabelled")]


def test_embedded_json_cannot_end_its_script(page):
    _, _, data = page
    evil = json.loads(json.dumps(data))
    evil["title"] = "</script><script>alert(1)</script> & <!--"
    text = embedded_json(evil)
    assert "<" not in text and ">" not in text and json.loads(text) == evil
    html = render_html(evil, charts={"pareto": [], "reliability": {
        v["name"]: "<svg></svg>" for v in evil["variants"]}})
    assert html.count("</script>") == 2  # the data block's and the sort script's own


def test_quantile_ci_brackets_the_quantile():
    from runs.html.build import quantile_ci

    x = np.arange(1.0, 41.0)
    lo, hi = quantile_ci(x, 0.5)
    assert lo <= np.median(x) <= hi and (lo, hi) == (14.0, 27.0)  # order statistics 14, 27
    assert quantile_ci([3.0], 0.5) == [None, None]


def test_search_page(tmp_path):
    """A search folder's report.html: valid, nothing fetched, search.json embedded unchanged,
    a stopped candidate said to be decided by sequential stopping."""
    import html5lib

    from runs.html.search import write_search_html

    cand = [{"step": i, "name": f"q{b}", "cost": float(b), "bits_per_weight": b + 1.0,
             "passed": b >= 6, "failed": [] if b >= 6 else ["kl-p95"], "tightest": "kl-p95",
             "slack": (b - 5) / 10, "n_used": 400 if b >= 6 else 120, "n_total": 400,
             "stopped": b < 6} for i, b in enumerate((4, 6, 8))]
    result = {"settings": {"model": None, "cost": "bits", "strategy": "greedy"},
              "outcome": "Winner q6 <passes>", "winner": dict(cand[1]),
              "finalists": [{"name": "q6", "bits_per_weight": 7.0, "model_bytes": 5.7e7,
                             "passed_eval": True, "failed_eval": []}],
              "candidates": cand,
              "totals": {"candidates": 3, "evaluated": 3, "reused": 0, "examples_used": 920,
                         "examples_full": 1200, "examples_saved_share": 0.233, "wall_s": 9.5}}
    (tmp_path / "search.json").write_text(json.dumps(result))
    page = write_search_html(tmp_path).read_text(encoding="utf-8")
    parser = html5lib.HTMLParser(strict=True)
    parser.parse(page)
    assert not re.search(r"https?://", page)
    dom = ReportDom()
    dom.feed(page)
    assert json.loads(dom.data) == result
    assert dom.sections == ["outcome", "finalists", "candidates"]
    assert page.count("sequential stopping</td>") == 1 and "Winner q6 &lt;passes&gt;" in page


def test_notebook_iframe_round_trips(html_sweep_small):
    """In a notebook the page sits in an iframe's srcdoc: unescaping it gives the page back."""
    import html as h

    from runs.html.notebook import show_report

    page = (html_sweep_small / "report.html").read_text(encoding="utf-8")
    markup = show_report(html_sweep_small, height=500).data
    m = re.fullmatch(r'<div><iframe srcdoc="([^"]*)" style="width: 100%; height: 500px; '
                     r'border: 1px solid #d1d9e0" title="variants report"></iframe></div>', markup)
    assert m and h.unescape(m.group(1)) == page
    with pytest.raises(FileNotFoundError, match="variants check"):
        show_report(html_sweep_small / "q8-g64")


def test_one_variant_model_card(html_sweep_small, tmp_path):
    """The report of one variant (an exported model card): its banner, clauses and data only."""
    from runs.html.render import write_html_report

    page = write_html_report(html_sweep_small, variants=["q4-g64"], out_dir=tmp_path)
    dom = ReportDom()
    dom.feed(page.read_text(encoding="utf-8"))
    data = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert [v["name"] for v in data["variants"]] == ["q4-g64"] == [n for n, _ in dom.banners]
    assert list(dom.clauses) == ["q4-g64"] and json.loads(dom.data) == data
    with pytest.raises(ValueError, match="no variant q5-g64 in .*; it has: q2-g64, q4-g64"):
        write_html_report(html_sweep_small, variants=["q5-g64"], out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_rendering_bug_is_one_line_naming_report_html(html_sweep_small, tmp_path,
                                                       monkeypatch):
    """A report that cannot render is a failed output (RunIncomplete: exit 1 in the CLI, one
    line naming report.html and why), never skipped in silence; nothing half-written."""
    import runs.html.render as render
    from runs.io import RunIncomplete

    def broken(data, charts=None):
        raise KeyError("ece_width")

    monkeypatch.setattr(render, "render_html", broken)
    with pytest.raises(RunIncomplete) as e:
        render.write_beside_markdown(html_sweep_small, out_dir=tmp_path)
    assert str(e.value) == (f"{tmp_path / 'report.html'} not written (KeyError: 'ece_width'); "
                            "run.json says incomplete. Rerun the same command to retry, or "
                            "report the error")
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "report.json").exists()
