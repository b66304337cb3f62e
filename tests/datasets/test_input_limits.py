"""Input at the limits: sizes beyond the data are refused, and big or hostile values
are cut to a readable length when an error message echoes them (one line, exit 2, nothing
written)."""

import shutil
from pathlib import Path

import pytest

from contracts.checker import ContractError, load_contract
from metrics._checks import short_list, short_path
from metrics.evaluate import METRICS, STRATA, check_metric_statistic, check_stratum
from variants.datasets import bundled as data
from variants.cli import main

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "2", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "sweep_small"
BIG = "x" * 5_000_000  # a 5 MB value (50 MB behaves the same, only slower to build)
LINE = 300  # most characters an error line may have, beyond a fixed list of allowed names
#: the fixed hint an unknown metric / stratum message carries (the names one may use)
HINT = {"metric": len(", ".join(METRICS)), "stratum": len(", ".join(STRATA)) + 120}
GOOD = {"id": '"a"', "metric": '"agreement"', "stratum": '"all"', "statistic": '"rate"',
        "min": "0.9"}


def _one_line(err, allowance=0):
    assert err.startswith("variants: error: ") and err.count("\n") == 1, err[:300]
    assert len(err) < LINE + allowance, err[:300]
    return err


# -- sizes beyond the data ------------------------------------------------------------------

@pytest.mark.parametrize("split", ["fit", "calibration", "eval"])
def test_a_size_beyond_the_split_exits_2_before_writing(tmp_path, capsys, split):
    available = len(data.split_frame(data.load_vader(), split))
    flag = f"--n-{split}"
    args = list(TINY)
    if flag in args:
        args[args.index(flag) + 1] = "1000000"
    else:
        args += [flag, "1000000"]
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *args])
    err = _one_line(capsys.readouterr().err)
    assert code == 2
    assert err == (f"variants: error: {flag} 1000000 is more than the {available} examples of the "
                   f"{split} split; pass {flag} {available} or less\n")
    assert not (tmp_path / "r").exists()


# -- big values echoed in errors -------------------------------------------------------------

def _contract(tmp_path, **fields):
    clause = {**GOOD, **fields}
    body = "\n".join(f"{k} = {v}" for k, v in clause.items())
    path = tmp_path / "big.toml"
    path.write_text(f'name = "big"\n[[clause]]\n{body}\n')
    return path


@pytest.mark.parametrize("field, value, expected", [
    ("id", f'"{BIG}"', "has id 'xxxx"),  # refused itself: at most 100 characters
    ("metric", f'"{BIG}"', "has unknown metric 'xxxx"),
    ("stratum", f'"{BIG}"', "has unknown stratum 'xxxx"),
    ("statistic", f'"{BIG}"', "has statistic 'xxxx"),
    ("compare", f'"{BIG}"', "has compare = 'xxxx"),
    ("min", f'"{BIG}"', "has min = 'xxxx"),
    (f'"{BIG}"', "1", "has unknown key(s) 'xxxx"),
])
def test_a_huge_clause_value_is_cut_in_the_message(tmp_path, field, value, expected):
    fields = {field: value}
    with pytest.raises(ContractError) as e:
        load_contract(_contract(tmp_path, **fields))
    msg = str(e.value)
    assert expected in msg and "\n" not in msg
    allowance = len(str(tmp_path)) + HINT.get(field, 0)
    assert len(msg) < LINE + allowance, msg[:400]
    assert "(5000002 chars)" in msg or "(5000000 chars)" in msg  # says how long it was


def test_huge_settings_and_top_level_keys_are_cut(tmp_path):
    path = tmp_path / "s.toml"
    clause = "\n".join(f"{k} = {v}" for k, v in GOOD.items())
    path.write_text(f'[settings]\nalpha = "{BIG}"\n[[clause]]\n{clause}\n')
    with pytest.raises(ContractError, match=r"\[settings\] alpha = 'xxx.*must be a finite") as e:
        load_contract(path)
    assert len(str(e.value)) < LINE
    path.write_text(f'"{BIG}" = 1\n[[clause]]\n{clause}\n')
    with pytest.raises(ContractError, match="unknown top-level key") as e:
        load_contract(path)
    assert len(str(e.value)) < LINE


def test_a_list_where_a_name_belongs_is_a_contract_error_not_a_traceback(tmp_path):
    """metric = [..] is unhashable: it used to raise TypeError from the dict lookup."""
    with pytest.raises(ContractError, match=r"has unknown metric \['a', 'b'\]"):
        load_contract(_contract(tmp_path, metric='["a", "b"]'))
    with pytest.raises(ValueError, match=r"unknown metric \['a'\]"):
        check_metric_statistic(["a"], "rate")


def test_check_stratum_and_metric_cut_huge_values():
    for call, hint in ((lambda: check_stratum(BIG), HINT["stratum"]),
                       (lambda: check_stratum([BIG]), 0),
                       (lambda: check_metric_statistic("agreement", BIG), 0),
                       (lambda: check_metric_statistic(BIG, "rate"), HINT["metric"])):
        with pytest.raises(ValueError) as e:
            call()
        assert len(str(e.value)) < LINE + hint and "chars)" in str(e.value)


def test_huge_contract_through_sweep_and_check_exits_2_with_one_short_line(tmp_path, capsys):
    big = _contract(tmp_path, stratum=f'"{BIG}"')
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, "--contract", str(big)])
    assert code == 2
    allowance = len(str(tmp_path)) + HINT["stratum"]
    _one_line(capsys.readouterr().err, allowance)
    assert not (tmp_path / "r").exists()
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    before = sorted(p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file())
    assert main(["check", str(run), "--contract", str(big)]) == 2
    assert "has unknown stratum 'xxx" in _one_line(capsys.readouterr().err, allowance)
    assert sorted(p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("args, message", [
    (["--run", "a/" + "x" * 200_000], "must be a plain folder name"),
    (["--run", "x" * 200_000], "longer than a folder name may be (255 bytes)"),
    (["--contract", "x" * 200_000 + ".toml"], "(File name too long)"),
    (["--contract", "d/" * 100_000 + "c.toml"], "contract file"),
])
def test_huge_sweep_arguments_are_cut(tmp_path, capsys, args, message):
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, *args])
    assert code == 2
    assert message in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", [["check"], ["plot"]])
def test_a_huge_results_folder_argument_is_cut(tmp_path, capsys, command):
    assert main([*command, str(tmp_path / ("y" * 200_000))]) == 2
    _one_line(capsys.readouterr().err)


def test_check_cuts_unknown_variant_names(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    assert main(["check", str(run), "--variant", "v" * 100_000, *[f"n{i}" for i in range(9)]]) == 2
    err = _one_line(capsys.readouterr().err, allowance=100)
    assert "and 5 more" in err and "no variant" in err


def test_short_path_and_short_list():
    assert short_path("results/run") == "results/run"
    cut = short_path("a" * 1000)
    assert len(cut) <= 160 and cut.startswith("aaa") and "(1000 chars)" in cut
    assert short_list(["x", "y"]) == "x, y"
    assert short_list(["a\nb"]) == "'a\\nb'"
    listed = short_list([str(i) for i in range(8)])
    assert listed == "0, 1, 2, 3, 4 and 3 more"
    assert len(short_list(["z" * 10_000])) <= 40


def test_huge_prune_schedule_and_streams_env_are_cut(monkeypatch):
    from variants.runtime import parallel
    from variants.families.prune.family import parse_schedule

    with pytest.raises(ValueError, match="--prune-schedule 'xxx") as e:
        parse_schedule(BIG)
    assert len(str(e.value)) < LINE and "(5000000 chars)" in str(e.value)
    monkeypatch.setenv("VARIANTS_STREAMS", "s" * 100_000)
    with pytest.raises(ValueError, match="VARIANTS_STREAMS must be a whole number") as e:
        parallel.validate_env()
    assert len(str(e.value)) < LINE
