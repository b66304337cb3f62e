"""One sensitivity cache for ``variants sensitivity`` and ``variants search``: the search's table
after the command's on the same setting measures nothing and equals the command's rows exactly;
another group size or other rows re-measure; two process workers give the local rows exactly."""

import re
import shutil

import pandas as pd
import pytest

N = ["--n-fit", "100", "--n-calibration", "40", "--n-search", "40", "--n-examples", "10"]


def _sensitivity(root, capsys, *args, out="s"):
    from variants.cli import main

    assert main(["sensitivity", *N, "--bits", "4", "8", "--results-dir", str(root / "r"),
                 "--out", str(root / out), "--no-progress", *args]) == 0
    err = capsys.readouterr().err
    read, total, measured = map(int, re.search(
        r"sensitivity: (\d+) of (\d+) rows read from the cache, (\d+) measured", err).groups())
    return pd.read_csv(root / out / "sensitivity.csv"), \
        (read, total, measured)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """``variants sensitivity`` on every unit of MiniLM at 4 and 8 bits, 10 rows."""
    root = tmp_path_factory.mktemp("sens_shared")
    import contextlib
    import io

    from variants.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["sensitivity", *N, "--bits", "4", "8", "--results-dir", str(root / "r"),
                     "--out", str(root / "s"), "--no-progress"]) == 0
    assert "sensitivity: 0 of 78 rows read from the cache, 78 measured" in err.getvalue()
    return root, pd.read_csv(root / "s" / "sensitivity.csv")


def test_the_search_reads_the_commands_rows_and_measures_nothing(first):
    from variants.search import worker
    from variants.search.driver import Search
    from variants.search.options import SearchOptions

    root, frame = first
    # 3 embedding tables + 36 encoder Linears, each at 4 and 8 bits; the head is not a unit
    assert len(frame) == 78 and frame["layer"].iloc[0].startswith("encoder.embeddings.")
    lines = []
    opts = SearchOptions(n_fit=100, n_calibration=40, n_eval=40, n_search=40, n_sensitivity=10,
                         bits=(4, 8), results_dir=str(root / "r"), finalize=False,
                         progress=False, select="value",
                         modes=(), unseen_rows=False).validate()  # the widths' table alone
    s = Search(opts, log=lines.append)
    s.prepare()
    worker.prepare_reference(s.state, s.payload)
    sens = s.sensitivity()
    assert s.sens_rows == {"read": 78, "measured": 0}
    assert "sensitivity: 78 of 78 rows read from the cache, 0 measured" in " ".join(lines)
    assert s.layers == list(dict.fromkeys(frame["layer"]))
    assert sens == {(r.layer, int(r.bits)): r.kl_mean for r in frame.itertuples()}  # exact


def test_another_group_size_or_other_rows_measure_again(first, capsys):
    root, frame = first
    one = ["--layers", r"layers\.0\.attention\.value$"]
    same, counts = _sensitivity(root, capsys, *one, out="same")
    assert counts == (2, 2, 0)
    pd.testing.assert_frame_equal(
        same, frame[frame["layer"] == "encoder.layers.0.attention.value"].reset_index(drop=True))
    _, counts = _sensitivity(root, capsys, *one, "--group-size", "32", out="g32")
    assert counts == (0, 2, 2)
    _, counts = _sensitivity(root, capsys, *one, "--n-examples", "12", out="n12")
    assert counts == (0, 2, 2)


@pytest.mark.slow
@pytest.mark.executors  # process workers: .ci/run runs it (pytest -m executors)
def test_two_process_workers_give_the_local_rows(first, capsys):
    """The fitted head is copied, not the rows: two spawned workers measure 5 units."""
    root, frame = first
    other = root / "proc"
    shutil.copytree(root / "r" / ".cache" / "heads", other / "r" / ".cache" / "heads")
    units = (r"word_embeddings|layers\.(?:0|5)\.attention\.value$"
             r"|layers\.3\.(?:intermediate|output)$")
    got, counts = _sensitivity(other, capsys, "--layers", units, "--executor", "process",
                               "--workers", "2")
    assert counts == (0, 10, 10)
    want = frame[frame["layer"].str.contains(units)].reset_index(drop=True)
    assert len(want) == 10
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_bad_executor_flags_exit_2_before_loading(tmp_path, capsys):
    from variants.cli import main

    for args, says in ((["--executor", "cluster"], "--executor must be one of local, process, "
                                                   "ray, got 'cluster'"),
                       (["--workers", "2"], "--workers 2 needs --executor process or ray"),
                       (["--ray-address", "x:1"], "--ray-address needs --executor ray")):
        assert main(["sensitivity", "--results-dir", str(tmp_path / "r"), *args]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()
