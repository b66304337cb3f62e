"""Corrupt or wrong-shaped files of a results folder: one line naming the file and the
fix, exit 2, nothing rewritten; after deleting the file a rerun succeeds.

`check` and `plot` run on a copy of the finished tiny sweep in tests/fixtures/sweep_small (plotted
once per module, so its PNGs exist); the sweep's resume and its caches are in
tests/commands/test_cli.py (slow, a real tiny sweep). The readers of the cache files are tested here
directly.
"""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from variants.cli import main
from runs.npz_readers import read_activation_stats, read_exit_heads, read_head_cache, read_outputs
from runs.readers import (CorruptFileError, read_build, read_metrics, read_run_json, read_summary,
                          read_timing, read_verdict)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sweep_small"
pytestmark = pytest.mark.plots  # `variants plot` must read (and refuse) the files for real


@pytest.fixture(scope="module")
def plotted_run(plotted_sweep_small):
    """The fixture sweep with its plots written (plots/*.png), drawn once per session
    (conftest); each test gets its own copy (``run``)."""
    run, paths = plotted_sweep_small
    assert len(paths) == 5
    return run


@pytest.fixture
def run(plotted_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(plotted_run, dst)
    return dst


def snapshot(folder):
    """{relative path: (sha256, mtime_ns)} of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                               p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path):
    path.write_bytes(bytes(range(256)) * 4)


def _json(obj):
    return lambda path: path.write_text(json.dumps(obj))


def _edit_json(edit):
    def apply(path):
        d = json.loads(path.read_text())
        edit(d)
        path.write_text(json.dumps(d))
    return apply


def _edit_npz(edit):
    def apply(path):
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        edit(arrays)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    return apply


def _pickled(path):
    with open(path, "wb") as f:
        np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)


# (file, corruption, commands that read it, words the one-line message must hold)
CASES = {
    "outputs truncated": ("q8-g64/outputs.npz", _truncate, ("check", "plot"),
                          "not a valid outputs file (BadZipFile"),
    "reference outputs garbage": ("reference/calibration_outputs.npz", _garbage, ("check",),
                                  "not a valid outputs file (ValueError: not an .npz archive"),
    "outputs pickled": ("q8-g64/outputs.npz", _pickled, ("check", "plot"),
                        "not an .npz archive of plain arrays"),
    "outputs probs of other K": ("q8-g64/outputs.npz",
                                 _edit_npz(lambda a: a.update(probs=a["probs"][:, :1])),
                                 ("check", "plot"), "probs has 1 options per row, logits has 3"),
    "outputs NaN logit": ("q8-g64/outputs.npz",
                          _edit_npz(lambda a: a["logits"].__setitem__((2, 0), np.nan)),
                          ("check", "plot"), "logits has NaN or inf on a valid option (row 2)"),
    "outputs probs above 1": ("q8-g64/outputs.npz",
                              _edit_npz(lambda a: a["probs"].__setitem__((0, 0), 1.5)),
                              ("check", "plot"), "probs has a value outside [0, 1]"),
    "outputs rows reordered": ("q8-g64/outputs.npz",
                               _edit_npz(lambda a: a.update({k: np.roll(v, 1, axis=0)
                                                             for k, v in a.items()})),
                               ("check", "plot"), "its ids differ from the reference's at"),
    "outputs without labels": ("q8-g64/outputs.npz", _edit_npz(lambda a: a.pop("labels")),
                               ("check", "plot"), "no labels array"),
    "run.json a list": ("run.json", _json([]), ("check", "plot"),
                        "not a valid run file (the file is a list [], expected a mapping)"),
    "run.json extras of lists": ("run.json", _edit_json(lambda d: d.update(extras={"q2-g64": [1]})),
                                 ("check",), "extras['q2-g64'] is a list"),
    "timing batches a str": ("q8-g64/timing.json", _edit_json(lambda d: d.update(batches="1")),
                             ("check",), "not a valid timing file (batches is a str '1', "
                                         "expected a mapping)"),
    "timing entry without speedup": ("q8-g64/timing.json",
                                     _edit_json(lambda d: d["batches"]["1"].pop("speedup")),
                                     ("check",), "batches['1'].speedup is missing"),
    "build config a str": ("q4-g64/build.json", _edit_json(lambda d: d.update(config="x")),
                           ("check",), "not a valid build file (config is a str 'x'"),
    "build family null": ("q8-g64/build.json", _edit_json(lambda d: d.update(family=None)),
                          ("check",), "not a valid build file (family is None, expected"),
    "build without family": ("q8-g64/build.json", _edit_json(lambda d: d.pop("family")),
                             ("check",), "not a valid build file (family is None, expected"),
    "build not JSON": ("q8-g64/build.json", _garbage, ("check",),
                       "not a valid build file (not JSON: UnicodeDecodeError"),
    "verdict clauses a str": ("q8-g64/verdict.json",
                              _edit_json(lambda d: d.update(clauses="agreement")), ("plot",),
                              "not a valid verdict file (clauses is a str 'agreement', expected "
                              "a list)"),
    "verdict clause threshold a str": ("q8-g64/verdict.json",
                                       _edit_json(lambda d: d["clauses"][0].update(threshold="x")),
                                       ("plot",), "clauses[0].threshold is a str"),
    "metrics a list": ("q8-g64/metrics.json", _json([1, 2]), ("plot",),
                       "not a valid metrics file (the file is a list [1, 2], expected a mapping)"),
    "summary unparseable": ("summary.csv",
                            lambda p: p.write_text("variant,family\nq8,quant,1,2\n\"x\n"),
                            ("plot",), "not a valid summary table (not CSV: ParserError"),
    "summary short row": ("summary.csv",
                          lambda p: p.write_text(p.read_text().splitlines()[0] + "\nq8-g64\n"),
                          ("plot",), "row 1 has no family (a cut or short row)"),
    "summary cut mid-row": ("summary.csv",
                            lambda p: p.write_text(p.read_text()[:p.read_text().index("\n") + 20]),
                            ("plot",), "has no verdict (a cut or short row)"),
    "summary variant twice": ("summary.csv",
                              lambda p: p.write_text(p.read_text().rstrip("\n") + "\n"
                                                     + p.read_text().splitlines()[1] + "\n"),
                              ("plot",), "is listed twice"),
    "summary without verdict": ("summary.csv",
                                lambda p: p.write_text("variant,family\nq8-g64,quant\n"),
                                ("plot",), "no column verdict"),
}


@pytest.mark.parametrize("case", CASES)
def test_corrupt_file_exits_2_naming_it_and_rewrites_nothing(run, capsys, case):
    rel, corrupt, commands, words = CASES[case]
    path = run / rel
    corrupt(path)
    before = snapshot(run)
    for command in commands:
        assert main([command, str(run)]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err  # one line
        assert err.startswith(f"variants: error: {path} is ") and words in err, err
        assert "delete it and rerun: only that part is rebuilt" in err
        assert snapshot(run) == before, f"{command} modified the run folder"


def test_plot_validates_every_file_before_writing_a_png(run, capsys):
    """The last variant's outputs are corrupt: no PNG is rewritten (same bytes, same mtime)."""
    pngs = snapshot(run / "plots")
    assert len(pngs) == 5
    _truncate(run / "q8-g64" / "outputs.npz")
    assert main(["plot", str(run)]) == 2
    assert f"{run / 'q8-g64' / 'outputs.npz'} is not a valid outputs file" in capsys.readouterr().err
    assert snapshot(run / "plots") == pngs


def test_deleting_the_file_and_rerunning_succeeds(run, capsys):
    """The fix the message gives works: a corrupt verdict.json deleted, plot succeeds (its
    contract lines come from the other variants) and check writes it again; a corrupt
    timing.json deleted, check succeeds (that variant has no speed row, so summary.csv
    is left alone)."""
    from contracts.checker import load_contract

    verdict = run / "q8-g64" / "verdict.json"
    verdict.write_text('{"clauses": "x"}')
    assert main(["plot", str(run)]) == 2
    verdict.unlink()
    assert main(["plot", str(run)]) == 0
    (run / "q8-g64" / "timing.json").write_text("[]")
    before = snapshot(run)
    assert main(["check", str(run)]) == 2
    assert snapshot(run) == before
    (run / "q8-g64" / "timing.json").unlink()
    assert main(["check", str(run)]) == 0
    rebuilt = read_verdict(verdict)  # rebuilt, valid, judged by the same contract
    assert [c["id"] for c in rebuilt["clauses"]] == [c.id for c in load_contract(None).clauses]
    assert snapshot(run)["summary.csv"] == before["summary.csv"]  # q8-g64 has no speed row
    capsys.readouterr()


def test_every_fixture_file_passes_its_reader():
    """The readers accept what the sweep writes (no false alarm on a real run)."""
    run = read_run_json(FIXTURE / "run.json")
    assert run["identity"]["n_eval"] == 40
    assert list(read_summary(FIXTURE / "summary.csv")["variant"]) == ["q8-g64", "q4-g64", "q2-g64"]
    for name in ("q2-g64", "q4-g64", "q8-g64", "reference"):
        for f in ("outputs.npz", "calibration_outputs.npz"):
            o = read_outputs(FIXTURE / name / f)
            assert o["logits"].shape == (40, 3) and o["option_mask"].dtype == bool
        if name != "reference":
            assert read_build(FIXTURE / name / "build.json")["config"]["bits"] == int(name[1])
            assert read_timing(FIXTURE / name / "timing.json")["batches"]["1"]["seq_len"] == 24
            assert read_metrics(FIXTURE / name / "metrics.json")["n_examples"] == 40
            assert len(read_verdict(FIXTURE / name / "verdict.json")["clauses"]) > 5


def test_cut_echo_of_a_huge_value(tmp_path):
    """A 1 MB string where a mapping belongs is echoed cut to a readable length."""
    p = tmp_path / "timing.json"
    p.write_text(json.dumps({"batches": "x" * 1_000_000}))
    with pytest.raises(CorruptFileError) as e:
        read_timing(p)
    assert len(str(e.value)) < 300 and "(1000000 chars)" in str(e.value)
    assert e.value.path == p and e.value.kind == "timing file"


def _npz(path, **arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


@pytest.mark.parametrize("arrays, words", [
    (None, "BadZipFile"),
    ({"t_keys": np.array([2, 3]), "t_values": np.array([1.0])}, "differ"),
    ({"t_keys": np.array([3]), "t_values": np.array([0.0])}, "not a finite number > 0"),
    ({"t_keys": np.array([3]), "t_values": np.array([1.5]), "head_weight": np.zeros((3, 5))},
     "head_weight is (3, 5) float64, expected float (3, 384)"),
    ({"t_keys": np.array([3]), "t_values": np.array([1.5])}, "head_weight is missing"),
])
def test_head_cache_reader(tmp_path, arrays, words):
    p = tmp_path / "head.npz"
    if arrays is None:
        p.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    else:
        _npz(p, **arrays)
    with pytest.raises(CorruptFileError, match="head cache file") as e:
        read_head_cache(p, {"weight": (3, 384), "bias": (3,)})
    assert words in str(e.value) and str(p) in str(e.value)
    good = _npz(tmp_path / "ok.npz", t_keys=np.array([2, 3]), t_values=np.array([0.5, 2.0]),
                head_weight=np.ones((3, 384), np.float32), head_bias=np.zeros(3, np.float32))
    assert read_head_cache(good, {"weight": (3, 384), "bias": (3,)})["t_values"].tolist() == [0.5, 2.0]


def test_activation_stats_reader(tmp_path):
    g, a, c = np.eye(4), np.ones(4), np.array(7, np.int64)
    good = _npz(tmp_path / "s.npz", **{"l.qkv|gram": g, "l.qkv|abs_sum": a, "l.qkv|count": c})
    (site,) = read_activation_stats(good, {"l.qkv"}).items()
    assert site[0] == "l.qkv" and site[1][2] == 7 and site[1][0].shape == (4, 4)
    for arrays, words in [({"l.qkv|gram": g, "l.qkv|abs_sum": a}, "lacks gram, abs_sum or count"),
                          ({"l.qkv|gram": g[:3], "l.qkv|abs_sum": a, "l.qkv|count": c},
                           "gram (3, 4)"),
                          ({"l.qkv|gram": g * np.nan, "l.qkv|abs_sum": a, "l.qkv|count": c},
                           "non-finite")]:
        with pytest.raises(CorruptFileError, match="activation statistics cache file") as e:
            read_activation_stats(_npz(tmp_path / "bad.npz", **arrays))
        assert words in str(e.value)
    with pytest.raises(CorruptFileError, match="no statistics for 'other'"):
        read_activation_stats(good, {"l.qkv", "other"})
    _truncate(good)
    with pytest.raises(CorruptFileError, match="BadZipFile"):
        read_activation_stats(good)


def test_exit_heads_reader(tmp_path):
    w, b = np.ones((3, 8), np.float32), np.zeros(3, np.float32)
    p = _npz(tmp_path / "h.npz", w1=w, b1=b, w2=w, b2=b)
    heads = read_exit_heads(p, [1, 2])
    assert len(heads) == 2 and heads[1][0].shape == (3, 8)
    with pytest.raises(CorruptFileError, match="no head for layer 3"):
        read_exit_heads(p, [1, 3])
    with pytest.raises(CorruptFileError, match=r"layer 1: w \(3, 8\) float32, b \(2,\)"):
        read_exit_heads(_npz(tmp_path / "x.npz", w1=w, b1=b[:2]), [1])
    with pytest.raises(CorruptFileError, match="exit heads cache file"):
        _garbage(p)
        read_exit_heads(p, [1])


SWEEP = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
         "--timing-rounds", "1", "--timing-warmup", "0", "--cold-start", "none", "--no-progress",
         "--bits", "8", "4", "--speed-mode", "simulated"]


@pytest.mark.parametrize("rel, corrupt, words", [
    ("q4-g64/calibration_outputs.npz", _truncate, "is not a valid outputs file (BadZipFile"),
    ("q8-g64/build.json", _json({"config": [8]}), "is not a valid build file (config is a list"),
    ("q8-g64/timing.json", _edit_json(lambda d: d["batches"]["1"].update(ref=3)),
     "is not a valid timing file (batches['1'].ref is an int 3, expected a mapping)"),
    ("run.json", _json({"identity": "x"}), "is not a valid run file (identity is a str"),
])
def test_sweep_resume_refuses_a_corrupt_saved_file_before_writing(tmp_path, capsys, rel,
                                                                   corrupt, words):
    """Sweep.prepare reads every saved file a resume would use: a corrupt one exits 2 naming it
    before anything is written (it used to be rebuilt silently, or to crash)."""
    root = tmp_path / "r"
    shutil.copytree(FIXTURE, root / "t")  # the fixture's settings are these SWEEP flags
    (root / "t" / "q2-g64").rename(root / "t" / "old")  # not asked for: not read
    _garbage(root / "t" / "old" / "outputs.npz")
    corrupt(root / "t" / rel)
    before = snapshot(root)
    assert main(["sweep", *SWEEP, "--results-dir", str(root), "--run", "t"]) == 2
    err = capsys.readouterr().err
    assert err == (f"variants: error: {root / 't' / rel} {words}" + err.split(words)[1])
    assert err.count("\n") == 1 and err.endswith("delete it and rerun: only that part is rebuilt\n")
    assert snapshot(root) == before


def test_sweep_resume_refuses_outputs_of_another_split_size(tmp_path, capsys):
    root = tmp_path / "r"
    shutil.copytree(FIXTURE, root / "t")
    run = json.loads((root / "t" / "run.json").read_text())
    run["identity"]["n_eval"] = 50  # as if run.json had been deleted and rewritten
    (root / "t" / "run.json").write_text(json.dumps(run))
    before = snapshot(root)
    assert main(["sweep", *SWEEP[:5], "50", *SWEEP[6:], "--results-dir", str(root),
                 "--run", "t"]) == 2
    err = capsys.readouterr().err
    assert f"{root / 't' / 'q8-g64' / 'outputs.npz'} holds 40 eval examples, this sweep uses 50" in err
    assert snapshot(root) == before


def test_family_describe_on_a_build_file_without_its_fields(tmp_path):
    """family_extras: a build.json lacking a field the family's describe() reads names the file."""
    from types import SimpleNamespace

    from runs.family_text import family_extras

    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "build.json").write_text("{}")
    (tmp_path / "v" / "timing.json").write_text("{}")
    family = SimpleNamespace(describe=lambda build, timing: f"threshold {build['threshold']}")
    with pytest.raises(CorruptFileError, match="exit field missing or of the wrong type: "
                                               "KeyError 'threshold'") as e:
        family_extras(tmp_path, "exit", ["v"], family=family)
    assert e.value.path == tmp_path / "v" / "build.json"
    (tmp_path / "v" / "build.json").write_text('{"threshold": 0.5}')
    assert family_extras(tmp_path, "exit", ["v"], family=family) == {"v": "threshold 0.5"}
