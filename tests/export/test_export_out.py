"""``variants export --out``: refused in one line, exit 2, before the source is read or the
variant built, when it is a file, not empty, or cannot be made (a parent that is a file, a
virtual file system such as /proc); the folder check leaves nothing behind."""

import sys

import pytest


@pytest.mark.parametrize("make, says", [
    (lambda t: (t / "f").write_text("x") and t / "f", "is a file; pass a new folder"),
    (lambda t: (t / "d").mkdir() or (t / "d" / "x").write_text("x") and t / "d",
     "is not empty; pass a new folder"),
    (lambda t: (t / "f").write_text("x") and t / "f" / "sub" / "out",
     "cannot create the folder in"),
])
def test_bad_out_is_refused_before_the_source_is_read(tmp_path, capsys, make, says):
    from variants.cli import main

    out = make(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    # the source does not exist: a refusal naming --out shows --out was checked first
    assert main(["export", str(tmp_path / "no-such-run"), "--variant", "v", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "--out" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_out_on_proc_names_the_fix(tmp_path, capsys):
    from variants.cli import main

    assert main(["export", str(tmp_path / "no-such-run"), "--variant", "v", "--out",
                 "/proc/no-such/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--out /proc/no-such/x: cannot create the folder in /proc" in err, err
    assert err.endswith("pass a writable folder") and len(err.splitlines()) == 1, err


def test_an_absent_out_in_a_writable_folder_passes_and_leaves_nothing(tmp_path):
    from variants.export.write import check_out

    check_out(tmp_path / "a" / "b" / "out")
    assert list(tmp_path.iterdir()) == []
