"""``variants compare``: exact McNemar by hand, paired bootstrap invariants (a variant against
itself, A and B swapped), refusals in one line, the --fail-if-worse gate (saved fixtures only,
no model)."""

import json
import shutil
from math import comb
from pathlib import Path

import numpy as np
import pytest

from runs.compare import CompareError, compare_pair, mcnemar, pairs
from variants.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures"
SMALL = FIXTURES / "sweep_small"


def test_mcnemar_exact_by_hand():
    # discordant pairs: A right only on 1 row, B right only on 7; 5 both, 2 neither
    x = np.array([1] * 1 + [0] * 7 + [1] * 5 + [0] * 2, bool)
    y = np.array([0] * 1 + [1] * 7 + [1] * 5 + [0] * 2, bool)
    m = mcnemar(x, y)
    # two-sided exact: 2 * P(Binomial(8, 1/2) <= 1) = 2 * (1 + 8) / 256
    assert m == {"n": 15, "a_only": 1, "b_only": 7, "both": 5, "neither": 2,
                 "p_value": pytest.approx(2 * (comb(8, 0) + comb(8, 1)) / 2**8, rel=1e-12)}
    assert mcnemar(x, x)["p_value"] == 1.0


@pytest.fixture(scope="module")
def q4_q8():
    (a, b), = pairs(f"{SMALL}:q8-g64", f"{SMALL}:q4-g64")
    return a, b, compare_pair(a, b, n_boot=200)


def test_against_itself_nothing_differs():
    (a, b), = pairs(f"{SMALL}:q4-g64", f"{SMALL}:q4-g64")
    r = compare_pair(a, b, n_boot=200)
    assert r["mcnemar_correct"]["p_value"] == 1.0 and r["mcnemar_flips"]["a_only"] == 0
    assert all(c["difference"] == 0 and c["ci"] == [0, 0] for c in r["clauses"]
               if c["a"] is not None)
    assert r["worse"] == [] and r["same_reference"] is True


def test_counts_and_swap_antisymmetry(q4_q8):
    a, b, r = q4_q8
    pa, pb = a.evaluation.per_example, b.evaluation.per_example
    fa, fb = pa["flip"].to_numpy(bool), pb["flip"].to_numpy(bool)
    m = r["mcnemar_flips"]
    assert (m["a_only"], m["b_only"], m["both"]) == ((fa & ~fb).sum(), (~fa & fb).sum(),
                                                     (fa & fb).sum())
    assert (m["a_only"], m["b_only"]) == (0, 1)  # q8 flips none of the 40 rows, q4 one
    back = compare_pair(b, a, n_boot=200)
    for c, d in zip(r["clauses"], back["clauses"]):
        assert c["clause"] == d["clause"]
        if c["difference"] is None:
            continue
        assert d["difference"] == pytest.approx(-c["difference"], abs=1e-12)
        # the same resamples on both sides: the swapped CI is the mirrored one
        assert d["ci"] == pytest.approx([-c["ci"][1], -c["ci"][0]], abs=1e-12)
    agree = next(c for c in r["clauses"] if c["clause"] == "agreement")
    assert (agree["a"], agree["b"]) == (1.0, 0.975)


def test_refuses_other_models_in_one_line():
    with pytest.raises(CompareError, match=r"^different models: A is minilm-sentiment .* B is "
                                           r"minilm-choice") as e:
        compare_pair(*pairs(f"{SMALL}:q8-g64", f"{FIXTURES / 'sweep_small_choice'}:q8-g64")[0])
    assert "\n" not in str(e.value)


def test_refuses_other_rows_naming_the_first(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(SMALL, other)
    f = other / "q8-g64" / "outputs.npz"
    d = dict(np.load(f))
    first = str(d["ids"][3])
    d["ids"] = d["ids"].copy()
    d["ids"][3] = "tweet:999999"
    np.savez(f, **d)
    with pytest.raises(CompareError, match=f"^different eval rows: row 3 is {first} in A but "
                                           "tweet:999999 in B"):
        compare_pair(*pairs(f"{SMALL}:q8-g64", f"{other}:q8-g64")[0])


def test_refuses_other_contracts(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(SMALL, other)
    v = json.loads((other / "q8-g64" / "verdict.json").read_text())
    v["clauses"][0]["threshold"] = 0.5
    (other / "q8-g64" / "verdict.json").write_text(json.dumps(v))
    with pytest.raises(CompareError, match="^different contracts: A default"):
        compare_pair(*pairs(f"{SMALL}:q8-g64", f"{other}:q8-g64")[0])


def test_cli_gate_and_outputs(tmp_path, capsys):
    a, b = f"{SMALL}:q8-g64", f"{SMALL}:q2-g64"
    out = tmp_path / "c.json"
    assert main(["compare", a, b, "--fail-if-worse", "--n-bootstrap", "200", "--json",
                 str(out), "--html", str(tmp_path / "c.html")]) == 1
    r = json.loads(out.read_text())
    assert "agreement" in r[0]["worse"] and "B is worse than A" in capsys.readouterr().out
    html = (tmp_path / "c.html").read_text()
    import html5lib

    html5lib.HTMLParser(strict=True).parse(html)  # raises on an HTML5 parse error
    assert "https://" not in html and "http://" not in html and "B WORSE" in html
    # a margin wider than every difference: the gate passes
    assert main(["compare", a, b, "--fail-if-worse", "--n-bootstrap", "200",
                 "--margin", "100"]) == 0
    assert main(["compare", a, f"{SMALL}:nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no variant 'nope'" in err and "q8-g64" in err


def test_worse_margins_by_hand():
    from runs.compare import worse

    rows = [{"clause": "agree", "higher_is_better": True, "threshold": 0.97, "ci": [-0.05, -0.02]},
            {"clause": "kl", "higher_is_better": False, "threshold": 0.05, "ci": [0.004, 0.01]},
            {"clause": "count", "higher_is_better": False, "threshold": 0.0, "ci": [1.0, 3.0]},
            {"clause": "none", "higher_is_better": False, "threshold": 0.1, "ci": [None, None]}]
    assert worse(rows, 0.0) == ["agree", "kl", "count"]
    assert worse(rows, 0.01) == ["agree", "count"]  # kl's CI reaches down to 0.004
    # 10% of |threshold|: agree may drop 0.097, kl rise 0.005; a zero threshold keeps 0
    assert worse(rows, 0.0, relative_margin=0.1) == ["count"]
    assert worse(rows, 0.0, relative_margin=0.07) == ["kl", "count"]  # kl may rise 0.0035 < 0.004


def _run_of(tmp_path, *keep):
    """A copy of the small run holding only the variants ``keep`` (summary.csv rows and
    folders)."""
    import pandas as pd

    run = tmp_path / "-".join(keep)
    shutil.copytree(SMALL, run)
    summary = pd.read_csv(run / "summary.csv")
    summary[summary["variant"].isin(keep)].to_csv(run / "summary.csv", index=False)
    for name in set(summary["variant"]) - set(keep):
        shutil.rmtree(run / name)
    return run


@pytest.mark.parametrize("a, b, says", [
    # none named: the message was "name one variant on both sides ... or none"
    (("q8-g64",), ("q4-g64", "q2-g64"),
     "refused: the runs have no variant in common (A: q8-g64; B: q4-g64, q2-g64); name the two "
     "to compare as RUN:VARIANT"),
    (("q4-g64", "q8-g64"), ("q2-g64",), "have no variant in common (A: q8-g64, q4-g64; B: q2-g64)"),
    (("q8-g64:",), ("q4-g64", "q2-g64"), "A names one variant but B is a run of 2 (q4-g64, "
                                         "q2-g64); name one variant on both sides"),
])
def test_compare_refusals_say_what_the_runs_hold(tmp_path, capsys, a, b, says):
    named = a[0].endswith(":")
    run_a = _run_of(tmp_path, *(x.rstrip(":") for x in a))
    spec_a = f"{run_a}:{a[0].rstrip(':')}" if named else str(run_a)
    assert main(["compare", spec_a, str(_run_of(tmp_path, *b))]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_two_runs_of_one_variant_each_are_compared_and_it_is_said(tmp_path, capsys):
    a, b = _run_of(tmp_path, "q8-g64"), _run_of(tmp_path, "q4-g64")
    assert main(["compare", str(a), str(b), "--n-bootstrap", "50"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ("variants compare: note: comparing B's q4-g64 with A's q8-g64: two "
                            "variants of different names\n")
    assert "## q4-g64 (B" in captured.out and "vs q8-g64 (A" in captured.out
    # the same name on both sides: nothing to say
    assert main(["compare", str(a), f"{SMALL}", "--n-bootstrap", "50"]) == 0
    assert capsys.readouterr().err == ""
    # the rule is in the help
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "two runs of one variant each are compared" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flag, value, says", [
    ("--n-bootstrap", "-1", "--n-bootstrap '-1' must be an integer in [1, 100000]"),
    ("--n-bootstrap", "0", "--n-bootstrap '0' must be an integer in [1, 100000]"),
    ("--n-bootstrap", "10000000", "must be an integer in [1, 100000]"),
    ("--seed", "-1", "--seed '-1' must be an integer >= 0"),
])
def test_compare_bad_numbers_name_the_flag(capsys, flag, value, says):
    with pytest.raises(SystemExit) as e:
        main(["compare", f"{SMALL}:q8-g64", f"{SMALL}:q4-g64", flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "n_boot" not in err and err.count("\n") == 1, err


def test_an_output_file_under_a_file_names_that_file(tmp_path, capsys):
    (tmp_path / "AFILE").write_text("x\n")
    target = tmp_path / "AFILE" / "c.json"
    assert main(["compare", f"{SMALL}:q8-g64", f"{SMALL}:q4-g64", "--json", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == (f"variants: error: --json {target}: {tmp_path / 'AFILE'} is a file, not "
                   "a folder; pass a writable place\n"), err  # was "cannot write there (File exists)"


def test_unlabelled_rows_get_no_mcnemar_on_correctness(tmp_path, capsys):
    """With no labelled row the "right (labelled rows)" McNemar is not computed (it printed
    p = 1.0, "no significant difference", on zero rows); the flip McNemar still is."""
    run = tmp_path / "run"
    shutil.copytree(SMALL, run)
    for f in run.rglob("*outputs.npz"):
        z = dict(np.load(f, allow_pickle=False))
        z["labels"] = np.full_like(z["labels"], -1)
        np.savez(f, **z)
    (a, b), = pairs(f"{run}:q8-g64", f"{run}:q4-g64")
    r = compare_pair(a, b, n_boot=50)
    assert r["n_labelled"] == 0 and r["mcnemar_correct"] is None
    assert (r["mcnemar_flips"]["a_only"], r["mcnemar_flips"]["b_only"]) == (0, 1)
    assert main(["compare", f"{run}:q8-g64", f"{run}:q4-g64", "--n-boot", "50"]) == 0
    out = capsys.readouterr().out
    assert "exact McNemar, right (labelled rows): not computed, no labelled row" in out
    assert "A only 0, B only 1" in out
