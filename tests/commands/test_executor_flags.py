"""``variants sweep`` and ``variants sensitivity`` with a Ray address that does not answer
(``--ray-address`` or ``RAY_ADDRESS``): one line naming the address and the fix, exit 2, before
anything is loaded, with no results folder written (as ``variants search`` does)."""

import socket

import pytest

try:
    import ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--no-progress"]


@pytest.mark.skipif(not HAVE_RAY, reason='ray not installed (pip install -e ".[ray]")')
@pytest.mark.parametrize("command", ["sweep", "sensitivity"])
@pytest.mark.parametrize("via_env", [False, True])
def test_dead_ray_address_exits_2_before_loading_with_nothing_written(tmp_path, capsys,
                                                                      monkeypatch, command,
                                                                      via_env):
    from variants.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    argv = [command, "--executor", "ray", "--results-dir", str(tmp_path / "r")]
    argv += TINY if command == "sweep" else ["--n-search", "40", "--no-progress"]
    if via_env:
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        argv += ["--ray-address", address]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"Ray address '{address}' does not answer" in err, err
    assert "ray start --head" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()
