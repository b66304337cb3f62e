"""Issue #40, item 5: feasibility first. Before any sensitivity or candidate work the search
checks that each rate clause's confidence bound can pass at all on its search-eval rows (the
Clopper–Pearson arithmetic of variants.search.bounds), and stops in one line (exit 2) naming
the rows it has, the rows needed and the fix; with enough rows it goes on as before."""

import json
import time
from pathlib import Path

import numpy as np
import pytest

from contracts.checker import contract_from_dict, load_contract

REPO = Path(__file__).resolve().parents[2]


def test_check_rows_by_hand():
    """Default contract under the bound rule: agreement and action agreement (min 0.97) need
    122 rows (0.025^(1/121) < 0.97 <= 0.025^(1/122)), negative flips (max 0.02) 183 labelled
    ones (tests/search/test_search.py::test_rows_a_rate_bound_needs_by_hand)."""
    from variants.search.bounds import bounded, check_rows

    b = bounded(load_contract(None))
    with pytest.raises(ValueError) as e:
        check_rows(b, 183, np.full(92, -1), "bound")
    assert str(e.value) == (
        "--n-search 183 gives 92 search-eval rows, but no candidate can pass agreement on fewer "
        "than 122, action-agreement on fewer than 122 (the 95% confidence bound of a rate with "
        "no error at all); raise --n-search to 243 or more (--data with more fit-split rows if "
        "it has fewer), or judge point values with --select value")
    # 45 of 92 labelled: negative flips need 183 labelled, about 183 x 92 / 45 -> 375 rows
    labels = np.where(np.arange(92) % 2 == 0, 1, -1)[:92]
    labels[:2] = -1  # 45 labelled
    assert (labels >= 0).sum() == 45
    with pytest.raises(ValueError) as e:
        check_rows(b, 183, labels, "bound")
    assert ("gives 92 search-eval rows (45 labelled), but no candidate can pass agreement on "
            "fewer than 122, negative-flips on fewer than 183 labelled, action-agreement on "
            "fewer than 122") in str(e.value)
    assert "raise --n-search to 749 or more (--data with more fit-split rows, labelled, if" \
        in str(e.value)
    # enough rows (every one labelled), or point values: nothing to say
    assert check_rows(b, 400, np.zeros(200, int), "bound") is None
    assert check_rows(load_contract(None), 40, np.zeros(20, int), "value") is None
    # a contract that asks for its bound itself is held to it under --select value too
    # (min 0.99: 0.99^367 = 0.02502 > 0.025 >= 0.99^368 = 0.02477)
    own = contract_from_dict({"name": "own", "clause": [
        {"id": "agree", "metric": "agreement", "stratum": "all", "statistic": "rate",
         "min": 0.99, "compare": "ci"}]})
    with pytest.raises(ValueError, match=r"agree on fewer than 368 .*or drop compare = \"ci\" "
                                         r"from those clauses of the contract$"):
        check_rows(own, 400, np.zeros(200, int), "value")


@pytest.fixture(scope="module")
def unlabelled_texts(tmp_path_factory):
    """(folder, model TOML, write(n) -> data file of the first n VADER tweets, text only)."""
    root = tmp_path_factory.mktemp("rows")
    toml = root / "bert.toml"
    toml.write_text('name = "tiny-bert"\nlogits = "classifier"\ncheckpoint = '
                    f'"{REPO / "tests" / "fixtures" / "hf" / "bert"}"\n')
    lines = (REPO / "data" / "vader" / "tweets_GroundTruth.txt").read_text(
        encoding="utf-8", errors="replace").splitlines()

    def write(n):
        path = root / f"texts{n}.jsonl"
        path.write_text("".join(json.dumps({"text": line.split("\t")[2]}) + "\n"
                                for line in lines[:n]))
        return path
    return root, toml, write


class Reached(Exception):
    pass


def _no_sensitivity(monkeypatch):
    from variants.search import driver

    def sensitivity(self):
        raise Reached(len(self.state["parts"]["search-eval"]))
    monkeypatch.setattr(driver.Search, "sensitivity", sensitivity)


def test_too_few_rows_stop_before_any_sensitivity_work(unlabelled_texts, monkeypatch, capsys):
    """300 unlabelled texts: 183 fit-split rows, 92 search-eval rows, and agreement needs 122:
    one line, exit 2, within seconds, sensitivity never called, nothing written."""
    from variants.cli import main

    root, toml, write = unlabelled_texts
    _no_sensitivity(monkeypatch)
    out = root / "s-few"
    t = time.perf_counter()
    assert main(["search", "--model-config", str(toml), "--data", str(write(300)),
                 "--results-dir", str(root / "r"), "--out", str(out), "--no-progress"]) == 2
    assert time.perf_counter() - t < 20  # load and split only (was minutes of sensitivity)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "variants: error: --n-search 183 gives 92 search-eval rows, but no candidate can pass "
        "agreement on fewer than 122, action-agreement on fewer than 122 (the 95% confidence "
        "bound of a rate with no error at all); raise --n-search to 243 or more (--data with "
        "more fit-split rows if it has fewer), or judge point values with --select value")
    assert not out.exists()


@pytest.mark.parametrize("n_texts, extra", [(500, []), (300, ["--select", "value"])])
def test_enough_rows_go_on_to_the_sensitivity(unlabelled_texts, monkeypatch, n_texts, extra):
    """500 texts give 150 search-eval rows (>= 122; negative flips have no labelled row: no
    examples, no FAIL); 300 texts under --select value (point values: no row count)."""
    from variants.cli import main

    root, toml, write = unlabelled_texts
    _no_sensitivity(monkeypatch)
    with pytest.raises(Reached) as e:
        main(["search", "--model-config", str(toml), "--data", str(write(n_texts)), *extra,
              "--results-dir", str(root / "r"), "--out", str(root / f"s{n_texts}"),
              "--no-progress"])
    assert e.value.args[0] >= (122 if not extra else 92)
