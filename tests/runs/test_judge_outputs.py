"""``variants judge RUN --outputs FILE``: logits from another runtime judged as a variant of a
saved run (tests/fixtures/sweep_small cut to the reference and q2-g64; no model is loaded).

The verdicts are checked against :func:`runs.judge.judge_outputs` on outputs derived
independently (:func:`runs.selftest.refinish`, its own action-map inference): a file holding a
sweep variant's logits must get that variant's verdict clause for clause, the reference's own
logits must pass with zero drift, and perturbed logits must fail the clause the judge fails."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from contracts.checker import load_contract
from runs.judge import judge_outputs
from runs.judge_file import judge_file, prepare
from runs.npz_readers import OUTPUT_FIELDS
from runs.selftest import refinish
from runs.settings import resolve_settings
from variants.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures"
SPLITS = {"calibration": "calibration_outputs.npz", "eval": "outputs.npz"}


def _load(run, name, split):
    with np.load(run / name / SPLITS[split]) as z:
        return {k: z[k] for k in z.files}


def rows_of(run, name="reference", logits=None):
    """[(id, logits of the row's options)] of a model folder, calibration then eval rows;
    ``logits`` {split: (N, K)} replaces the saved ones."""
    out = []
    for split in SPLITS:
        z = _load(run, name, split)
        values = z["logits"] if logits is None else logits[split]
        out += [(str(i), v[m]) for i, v, m in zip(z["ids"], values, z["option_mask"])]
    return out


def write(path, rows, latency=None):
    """Write ``rows`` [(id, logits)] in the format of ``path``'s suffix (``.wide.parquet``:
    logit_<j> columns); ``latency`` (N,) per row, None for none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [r[0] for r in rows]
    width = max(len(r[1]) for r in rows)
    wide = np.full((len(rows), width), np.nan)
    for i, (_, v) in enumerate(rows):
        wide[i, :len(v)] = v
    if path.suffix == ".jsonl":
        with open(path, "w") as f:
            for i, (rid, v) in enumerate(rows):
                row = {"id": rid, "logits": [float(x) for x in v]}
                if latency is not None:
                    row["latency_ms"] = float(latency[i])
                f.write(json.dumps(row) + "\n")
    elif path.suffix == ".npz":
        extra = {} if latency is None else {"latency_ms": np.asarray(latency, float)}
        np.savez(path, ids=np.asarray(ids, dtype=str), logits=wide, **extra)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = {"id": pa.array(ids)}
        if path.name.endswith(".wide.parquet"):
            for j in range(width):
                cols[f"logit_{j}"] = pa.array([None if np.isnan(x) else float(x)
                                               for x in wide[:, j]], pa.float32())
        else:
            cols["logits"] = pa.array([[float(x) for x in v] for _, v in rows],
                                      pa.list_(pa.float64()))
        if latency is not None:
            cols["latency_ms"] = pa.array([float(x) for x in latency])
        pq.write_table(pa.table(cols), path)
    return path


def expected(run, logits, name="reference"):
    """The judge's verdict of ``logits`` {split: (N, K)} derived by runs.selftest.refinish."""
    contract = load_contract("default")
    meta = json.loads((run / "run.json").read_text())
    st = resolve_settings(contract, meta)
    ref = {s: _load(run, "reference", s) for s in SPLITS}
    var = {s: refinish({k: ref[s][k] for k in OUTPUT_FIELDS},
                       logits=logits[s].astype(np.float32)) for s in SPLITS}
    ev, verdict, _ = judge_outputs(ref["calibration"], ref["eval"], var["calibration"],
                                   var["eval"], contract, settings=st)
    return ev, verdict


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(Path(folder).rglob("*"))}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """sweep_small with the reference and q2-g64 only (one variant: each check is quick).
    Read-only: tests that write copy it (:func:`fresh`)."""
    out = tmp_path_factory.mktemp("judge") / "small"
    shutil.copytree(FIXTURES / "sweep_small", out,
                    ignore=shutil.ignore_patterns("q4-g64", "q8-g64", "report.md"))
    return out


@pytest.fixture
def fresh(run, tmp_path):
    out = tmp_path / "small"
    shutil.copytree(run, out)
    return out


def test_the_references_own_logits_pass_with_zero_drift(run, tmp_path):
    p = prepare(run, write(tmp_path / "ref.jsonl", rows_of(run)))
    s, v = p["evaluation"].summary, p["verdict"]
    assert v.passed and not v.failed and not v.undecided and p["name"] == "outputs-ref"
    assert s["epsilon"] == 0 and s["max_abs_logit_diff_max"] == 0 and s["kl_max"] == 0
    assert s["agreement"] == 1 and s["action_max_abs_diff_max"] == 0 and s["certified_share"] == 1
    assert s["score_abs_err_max"] == 0 and s["ece_delta"] == 0


def test_a_variants_logits_get_that_variants_verdict(run, tmp_path):
    p = prepare(run, write(tmp_path / "q2.jsonl", rows_of(run, "q2-g64")))
    saved = {s: _load(run, "q2-g64", s) for s in SPLITS}
    for split in SPLITS:  # the outputs the sweep saved for q2, bit for bit
        got = p["outputs"][split]
        for k in OUTPUT_FIELDS:
            np.testing.assert_array_equal(getattr(got, k), saved[split][k], err_msg=k)
    ev, verdict = expected(run, {s: saved[s]["logits"] for s in SPLITS})
    assert p["verdict"].failed == verdict.failed and "agreement" in verdict.failed
    assert p["verdict"].to_dict() == verdict.to_dict()
    assert p["evaluation"].summary["epsilon"] == ev.summary["epsilon"] > 1


@pytest.mark.parametrize("scale, clause", [(1.2, "temperature-refit"), (3.0, "kl-p95")])
def test_perturbed_logits_fail_the_clause_the_judge_fails(run, tmp_path, scale, clause):
    ref = {s: _load(run, "reference", s)["logits"].astype(np.float64) * scale for s in SPLITS}
    p = prepare(run, write(tmp_path / "scaled.jsonl", rows_of(run, logits=ref)))
    _, verdict = expected(run, ref)
    assert clause in verdict.failed
    assert p["verdict"].failed == verdict.failed
    assert p["verdict"].to_dict() == verdict.to_dict()


def test_jsonl_npz_and_parquet_give_identical_verdicts(run, tmp_path):
    rng = np.random.default_rng(0)
    rows = [(i, v + rng.normal(0, 0.05, v.size)) for i, v in rows_of(run)]
    rng.shuffle(rows)  # any row order: rows are matched by id
    got = {}
    for name in ("n.jsonl", "n.npz", "n.parquet", "n.wide.parquet"):
        p = prepare(run, write(tmp_path / name, rows), name="same")
        got[name] = p
        assert p["file"].format == name.rsplit(".", 1)[1]
    first = got["n.jsonl"]
    for name, p in got.items():
        assert p["verdict"].to_dict() == first["verdict"].to_dict(), name
        for split in SPLITS:
            np.testing.assert_array_equal(p["outputs"][split].probs,
                                          first["outputs"][split].probs)
    assert first["evaluation"].summary["epsilon"] > 0


def _refused(run_dir, file, capsys, *extra):
    before = snapshot(run_dir)
    capsys.readouterr()
    code = main(["judge", str(run_dir), "--outputs", str(file), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and snapshot(run_dir) == before, err
    assert err.startswith("variants: error: ") and "\n" not in err
    return err


def test_missing_extra_and_duplicated_ids_are_refused_naming_them(run, tmp_path, capsys):
    rows = rows_of(run)
    n_cal = len(_load(run, "reference", "calibration")["ids"])
    dropped = rows[n_cal + 3][0]
    bad = rows[:n_cal + 3] + rows[n_cal + 4:] + [("tweet:nope", rows[0][1]), rows[5], rows[5]]
    err = _refused(run, write(tmp_path / "bad.jsonl", bad), capsys)
    assert f"1 ({rows[5][0]}) ids appear more than once" in err
    assert f"1 ({dropped}) of the run's 40 eval rows are missing" in err
    assert "1 (tweet:nope) ids are not rows of the run" in err
    err = _refused(run, write(tmp_path / "eval_only.npz", rows[n_cal:]), capsys)
    assert "40 (" in err and "and 35 more) of the run's 40 calibration rows are missing" in err
    assert "the calibration rows give ε" in err


def test_a_wrong_logit_count_is_refused_naming_the_rows(run, tmp_path, capsys):
    rows = rows_of(run)
    bad = [(i, v[:2]) if k in (1, 7) else (i, v) for k, (i, v) in enumerate(rows)]
    err = _refused(run, write(tmp_path / "k2.jsonl", bad), capsys)
    assert f"2 ({rows[1][0]} (2, not 3), {rows[7][0]} (2, not 3)) rows have a logit count" in err
    assert "K = 3" in err


@pytest.mark.parametrize("text, says", [
    ('{"id": "a", "logits": [1, "x"]}\n', "line 1 (id 'a'): logits is [1, 'x'], expected a "
                                          "non-empty list of numbers"),
    ('{"logits": [1.0]}\n', "line 1: id is None, expected a string"),
    ('not json\n', "line 1 is not JSON"),
    ('{"id": "a", "logits": [1.0], "latency_ms": -3}\n', "line 1: latency_ms is -3"),
])
def test_a_malformed_jsonl_line_is_refused_in_one_line(run, tmp_path, capsys, text, says):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    assert says in _refused(run, f, capsys)


def test_an_unknown_format_is_refused(run, tmp_path, capsys):
    f = tmp_path / "logits.csv"
    f.write_text("id,logit_0\n")
    assert "unknown format '.csv'; pass a .jsonl, .ndjson, .npz, .parquet, .pq file" in \
        _refused(run, f, capsys)


def test_judged_into_the_run_compared_and_rerun_idempotently(fresh, tmp_path, capsys):
    from runs.compare import compare_pair, pairs

    lat = np.arange(80, dtype=float)  # 0 … 79 ms: p50 39.5, p95 75.05, mean 39.5
    f = write(tmp_path / "endpoint.jsonl", rows_of(fresh, "q2-g64"), latency=lat)
    assert main(["judge", str(fresh), "--outputs", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("outputs-endpoint  FAIL  ")
    v = fresh / "outputs-endpoint"
    for name in ("outputs.npz", "calibration_outputs.npz", "build.json", "timing.json",
                 "verdict.json", "metrics.json", "report.md", "family.md"):
        assert (v / name).is_file(), name
    assert json.loads((v / "verdict.json").read_text())["failed"] == \
        json.loads((fresh / "q2-g64" / "verdict.json").read_text())["failed"]
    timing = json.loads((v / "timing.json").read_text())
    assert timing["mode"] == "measured elsewhere" and timing["batches"] == {}
    el = timing["measured_elsewhere"]
    assert (el["p50_ms"], el["mean_ms"], el["n"]) == (39.5, 39.5, 80)
    assert el["p95_ms"] == pytest.approx(75.05)
    import pandas as pd

    summary = pd.read_csv(fresh / "summary.csv").set_index("variant")
    assert summary.loc["outputs-endpoint", "family"] == "outputs"
    assert summary.loc["outputs-endpoint", "elsewhere_latency_p50_ms"] == 39.5
    assert pd.isna(summary.loc["outputs-endpoint", "b1_speedup"])
    report = (fresh / "report.md").read_text()
    assert "====== Latency measured elsewhere ======" in report
    assert "1 judged from an outputs file (outputs-endpoint" in report
    assert "nan" not in report.split("====== outputs-endpoint")[1].split("======")[1]

    (a, b), = pairs(f"{fresh}:q2-g64", f"{fresh}:outputs-endpoint")
    r = compare_pair(a, b, n_boot=50)
    assert r["worse"] == [] and r["speed"] == []
    assert all(c["difference"] == 0 for c in r["clauses"] if c["a"] is not None)

    files = ("outputs-endpoint/verdict.json", "outputs-endpoint/report.md", "summary.csv",
             "report.md", "check.json")
    before = {n: (fresh / n).read_bytes() for n in files}
    (fresh / ".outputs-endpoint.judging").mkdir()  # what a judge killed midway leaves
    (fresh / ".outputs-endpoint.judging" / "outputs.npz").write_bytes(b"half")
    assert main(["judge", str(fresh), "--outputs", str(f)]) == 0  # the same file again
    assert {n: (fresh / n).read_bytes() for n in files} == before
    assert not (fresh / ".outputs-endpoint.judging").exists()

    other = write(tmp_path / "x" / "endpoint.jsonl", rows_of(fresh))  # same stem, other logits
    err = _refused(fresh, other, capsys)
    assert "holds the judged outputs of another file" in err and "--force" in err
    assert main(["judge", str(fresh), "--outputs", str(other), "--force"]) == 0
    assert json.loads((v / "verdict.json").read_text())["passed"] is True
    err = _refused(fresh, other, capsys, "--name", "q2-g64", "--force")
    assert "is a variant of family quant; pass another --name" in err


def test_nan_logits_are_judged_not_refused(run, tmp_path):
    rows = rows_of(run)
    bad_id = rows[-1][0]
    rows[-1] = (bad_id, np.array([np.nan, 1.0, 0.0]))
    p = prepare(run, write(tmp_path / "nan.jsonl", rows))
    assert "finite-outputs" in p["verdict"].failed
    assert p["evaluation"].nonfinite["eval"] == [bad_id]


def test_the_action_map_of_a_multi_task_run_gives_the_sweeps_outputs(tmp_path):
    """sweep_small_choice: four tasks of 2-5 options, 3 actions."""
    src = FIXTURES / "sweep_small_choice"
    p = prepare(src, write(tmp_path / "q4.npz", rows_of(src, "q4-g64")))
    for split in SPLITS:
        saved = _load(src, "q4-g64", split)
        for k in ("probs", "action_probs", "expected_score", "confidence", "logits"):
            np.testing.assert_array_equal(getattr(p["outputs"][split], k), saved[k], err_msg=k)


def test_recover_action_map_by_hand():
    from runs.action_map import recover_action_map

    # one row each (no group has rank): options -> actions (0, 0, 1) and (1, 0, 0)
    probs = np.array([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]])
    amap = np.array([[[1, 0], [1, 0], [0, 1]], [[0, 1], [1, 0], [1, 0]]], float)
    out = {"probs": probs, "action_probs": np.einsum("nk,nka->na", probs, amap),
           "option_mask": np.ones((2, 3), bool), "task": np.array(["t", "u"]),
           "ids": np.array(["a", "b"])}
    np.testing.assert_array_equal(recover_action_map(out), amap)
    # two options of equal probability going to different actions: not told apart
    tie = dict(out, probs=np.array([[0.4, 0.4, 0.2]]), task=np.array(["t"]),
               option_mask=np.ones((1, 3), bool), ids=np.array(["c"]))
    tie["action_probs"] = np.einsum("nk,nka->na", tie["probs"],
                                    np.array([[[1, 0], [0, 1], [0, 1]]], float))
    with pytest.raises(ValueError, match=r"map of 1 rows \(ids c\) cannot be told"):
        recover_action_map(tie)


def test_judge_imports_no_mlx(fresh, tmp_path):
    """A fresh interpreter judges a file without importing MLX (as `variants check`); its
    report.html (rendered for real there) shows the latency measured elsewhere."""
    import subprocess
    import sys

    f = write(tmp_path / "ref.npz", rows_of(fresh), latency=np.full(80, 2.5))
    probe = ("import json, sys\nfrom variants.cli import main\n"
             f"code = main(['judge', {str(fresh)!r}, '--outputs', {str(f)!r}])\n"
             "print(json.dumps({'code': code, 'mlx': [m for m in sys.modules "
             "if m == 'mlx' or m.startswith('mlx.')]}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"code": 0, "mlx": []}
    assert (fresh / "outputs-ref" / "verdict.json").is_file()
    page = (fresh / "report.html").read_text()
    assert "<h3>Latency measured elsewhere</h3>" in page and "p50 2.50 ms measured elsewhere" in page
    assert '<tr><td class="mono">outputs-ref</td><td class="num">2.50</td>' in page


def test_parquet_and_npz_problems_are_refused_in_one_line(run, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "gap.parquet"
    pq.write_table(pa.table({"id": ["a"], "logit_0": [1.0], "logit_2": [2.0]}), f)
    assert "logit columns logit_0, logit_2 are not logit_0 … logit_1" in _refused(run, f, capsys)
    f = tmp_path / "objects.npz"
    np.savez(f, ids=np.array(["a", None], dtype=object), logits=np.zeros((2, 3)))
    assert "an array of Python objects" in _refused(run, f, capsys)
    assert "outputs file " in _refused(run, tmp_path / "absent.jsonl", capsys)
    rows = rows_of(run)  # a null among a row's options (padding is allowed only past them)
    f = write(tmp_path / "nulls.wide.parquet", [(i, v) for i, v in rows])
    t = pq.read_table(f)
    col = t.column("logit_1").to_pylist()
    col[3] = None
    pq.write_table(t.set_column(2, "logit_1", pa.array(col, pa.float32())), f)
    assert f"1 ({rows[3][0]}) rows have a null logit among their options" in \
        _refused(run, f, capsys)


def test_the_contract_is_the_one_the_run_was_judged_with(fresh, tmp_path, capsys):
    f = write(tmp_path / "ref.jsonl", rows_of(fresh))
    meta = json.loads((fresh / "run.json").read_text())
    (fresh / "run.json").write_text(json.dumps(dict(meta, contract="lenient")))
    assert prepare(fresh, f)["verdict"].contract == "lenient"
    assert prepare(fresh, f, contract="default")["verdict"].contract == "default"
    mine = tmp_path / "mine.toml"
    mine.write_text((Path(__file__).parents[2] / "contracts" / "lenient.toml").read_text()
                    .replace('name = "lenient"', 'name = "mine"'))
    (fresh / "run.json").write_text(json.dumps(dict(meta, contract="mine", config=dict(
        meta["config"], contract=str(mine)))))
    assert prepare(fresh, f)["verdict"].contract == "mine"
    mine.unlink()
    err = _refused(fresh, f, capsys)
    assert "was judged with contract 'mine', whose file" in err and "--contract FILE" in err
