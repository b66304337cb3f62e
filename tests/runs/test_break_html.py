"""Hostile but realistic input to report.html and ``variants compare``: example texts with
markup, template syntax, bidi controls and no spaces; non-finite margins; output files that
cannot be written (refused in one line, exit 2, before any work)."""

import copy
import json
import re
from pathlib import Path

import pytest

from browser import ReportDom
from runs.html.render import TEMPLATES, render_html
from variants.cli import main

SMALL = Path(__file__).parents[1] / "fixtures" / "sweep_small"
HOSTILE = ["</script><script>alert(1)</script>", "<img src=x onerror=alert(2)>",
           "{{ 7*7 }} {% raw %}", "مرحبا \u202e RTL override 😀👍🏽", "x" * 239 + "…",
           "&lt;b&gt; & \"quotes\" '"]


@pytest.fixture(scope="module")
def hostile(html_sweep_small):
    data = json.loads((html_sweep_small / "report.json").read_text(encoding="utf-8"))
    data = copy.deepcopy(data)
    v = next(v for v in data["variants"] if v["flipped"])
    row = v["flipped"][0]
    v["flipped"] = [dict(row, text=t, id=f"{row['id']}-{k}") for k, t in enumerate(HOSTILE)]
    return data, render_html(data)


@pytest.mark.html
def test_hostile_texts_stay_text(hostile):
    import html5lib

    data, html = hostile
    parser = html5lib.HTMLParser(strict=True)
    doc = parser.parse(html)
    assert parser.errors == []
    p = ReportDom()
    p.feed(html)
    assert json.loads(p.data) == data  # "</script>" did not end the data block early
    # one script element holds code, one the data: no injected script or img element
    assert len(re.findall(r"<script\b", html)) == 2 and "<img" not in html
    assert "{{ 7*7 }}" in html and "49" not in re.findall(r"<td>([^<]*)</td>", html)
    cells = ["".join(td.itertext()) for td in doc.iter("{http://www.w3.org/1999/xhtml}td")]
    assert all(t in cells for t in HOSTILE)  # each shown as the very text, once parsed


@pytest.mark.html
def test_long_and_bidi_texts_cannot_break_the_layout(hostile):
    _, html = hostile
    # a 240-character token without spaces wraps inside its cell instead of widening the
    # table past the page; a right-to-left override stays inside its cell (dir="auto" and
    # unicode-bidi isolation)
    assert re.search(r'<td class="text" dir="auto">x{239}…</td>', html)
    css = (TEMPLATES / "report.css").read_text(encoding="utf-8")
    rule = re.search(r"td\.text\s*\{([^}]*)\}", css)
    assert rule and "overflow-wrap: anywhere" in rule.group(1)
    assert "unicode-bidi: isolate" in rule.group(1)


@pytest.mark.parametrize("margin", ["nan", "inf", "-inf"])
def test_compare_refuses_non_finite_margins(margin, capsys):
    for flag in ("--margin", "--relative-margin"):
        assert main(["compare", f"{SMALL}:q8-g64", f"{SMALL}:q4-g64", "--fail-if-worse",
                     f"{flag}={margin}"]) == 2
        out = capsys.readouterr()
        assert out.out == "" and len(out.err.strip().splitlines()) == 1
        assert flag in out.err and "finite" in out.err


@pytest.mark.parametrize("flag", ["--json", "--markdown", "--html"])
def test_compare_refuses_unwritable_outputs_before_work(flag, tmp_path, capsys):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    for target in ("/proc/compare.out", str(folder), ""):
        assert main(["compare", f"{SMALL}:q8-g64", f"{SMALL}:q4-g64", flag, target]) == 2
        out = capsys.readouterr()
        assert out.out == ""  # refused before the comparison ran (nothing printed)
        assert len(out.err.strip().splitlines()) == 1 and flag in out.err
    assert list(folder.iterdir()) == []


def _without_verdict(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(SMALL, run)
    (run / "q2-g64" / "verdict.json").unlink()  # a variant the judge never reached
    return run


def test_a_variant_without_verdict_is_not_shown_passing(tmp_path):
    from runs.html.data import verdict_word

    assert verdict_word({}) == "untested"
    assert verdict_word({"clauses": [{"id": "a", "status": "pass"}], "failed": [],
                         "untested": []}) == "pass"


def test_compare_names_the_missing_verdict(tmp_path, capsys):
    run = _without_verdict(tmp_path)
    assert main(["compare", f"{run}:q2-g64", f"{SMALL}:q2-g64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "verdict.json" in err and "variants check" in err


@pytest.mark.html
def test_search_page_with_non_finite_numbers(tmp_path):
    # search.json is written with Python's json (NaN and Infinity allowed): a candidate whose
    # tightest clause had no value (slack NaN) or an infinite cost still gets its page
    import html5lib

    from runs.html.search import write_search_html

    cand = [{"step": 0, "name": "q4", "cost": 4.0, "passed": False, "failed": ["kl-p95"],
             "tightest": "kl-p95", "slack": float("nan"), "stopped": False},
            {"step": 1, "name": "q8", "cost": float("inf"), "passed": True, "failed": [],
             "tightest": "kl-p95", "slack": 0.25, "stopped": False},
            {"step": 2, "name": "q6", "cost": 6.0, "passed": True, "failed": [],
             "tightest": "kl-p95", "slack": 0.125, "stopped": True}]
    result = {"settings": {"cost": "bits"}, "outcome": "Winner q6", "winner": dict(cand[2]),
              "candidates": cand, "totals": {"candidates": 3, "wall_s": float("nan")}}
    (tmp_path / "search.json").write_text(json.dumps(result))
    path = write_search_html(tmp_path)
    assert path == tmp_path / "report.html"
    page = path.read_text(encoding="utf-8")
    parser = html5lib.HTMLParser(strict=True)
    parser.parse(page)
    assert parser.errors == []
    dom = ReportDom()
    dom.feed(page)
    data = json.loads(dom.data)
    assert data["candidates"][0]["slack"] is None and data["candidates"][1]["cost"] is None
    assert data["totals"]["wall_s"] is None and data["winner"]["slack"] == 0.125
    assert page.count("<circle") + page.count("<path") > 0  # the chart was still drawn
