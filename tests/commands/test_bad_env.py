"""A ``VARIANTS_*`` variable with a closed set of values holding anything else is refused before
a command starts: one line naming the variable and the values it takes, exit 2, nothing written
(it was read as the default: ``VARIANTS_QKERNEL=banana`` ran with the kernel on)."""

import pytest

from variants.cli import main
from variants.runtime import env


@pytest.mark.parametrize("name, value, allowed", [
    ("VARIANTS_QKERNEL", "banana", "on or off (also 1/0, true/false, yes/no)"),
    ("VARIANTS_QKERNEL", "of", "on or off (also 1/0, true/false, yes/no)"),
    ("VARIANTS_FUSED_LAYER", "disabled", "on or off (also 1/0, true/false, yes/no)"),
    ("VARIANTS_KERNEL_ISA", "avx512", "auto, baseline"),
    ("VARIANTS_FUSED_THREADS", "3", "auto, 1, 2"),
    ("VARIANTS_FUSED_THREADS", "two", "auto, 1, 2"),
    ("VARIANTS_MODERNBERT_ATTENTION", "sliding", "auto, windowed, masked"),
    ("VARIANTS_DEVICE", "xpu", "cpu, gpu"),
])
def test_an_unknown_value_is_refused_in_one_line(tmp_path, capsys, monkeypatch, name, value,
                                                 allowed):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    assert main(["list"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"variants: error: {name}={value!r} is not one of: {allowed}; set "
                            "one of them, or unset it for the default\n"), captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []
    with pytest.raises(env.EnvError, match=name):  # a library caller gets the same refusal
        env.choice(name)


@pytest.mark.parametrize("name, value, read", [
    ("VARIANTS_QKERNEL", "", "on"), ("VARIANTS_QKERNEL", " OFF ", "off"),
    ("VARIANTS_QKERNEL", "0", "0"), ("VARIANTS_FUSED_LAYER", "no", "no"),
    ("VARIANTS_KERNEL_ISA", "Baseline", "baseline"), ("VARIANTS_FUSED_THREADS", "1", "1"),
    ("VARIANTS_MODERNBERT_ATTENTION", "", "auto"), ("VARIANTS_DEVICE", "gpu", "gpu"),
])
def test_the_documented_values_are_read(monkeypatch, name, value, read):
    monkeypatch.setenv(name, value)
    assert env.choice(name) == read
    assert env.problem() is None


def test_the_switches_read_off_only_from_an_off_value(monkeypatch):
    from variants.runtime import fused_layer, qkernel

    for value, on in (("", True), ("on", True), ("1", True), ("off", False), ("false", False)):
        monkeypatch.setenv("VARIANTS_QKERNEL", value)
        monkeypatch.setenv("VARIANTS_FUSED_LAYER", value)
        assert qkernel.enabled() is on and fused_layer.enabled() is on
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "banana")
    with pytest.raises(env.EnvError, match="VARIANTS_FUSED_LAYER='banana' is not one of"):
        fused_layer.enabled()


def test_every_closed_set_variable_read_in_the_package_is_listed():
    # a new VARIANTS_* variable read with os.environ bypasses the check: read it with env.choice
    # or list it here as open-ended
    import re
    from pathlib import Path

    root = Path(env.__file__).parents[1]
    read = set()
    for path in root.rglob("*.py"):
        read |= set(re.findall(r"environ\.get\(\s*\"(VARIANTS_[A-Z_]+)\"", path.read_text()))
    assert read <= {"VARIANTS_BLAS", "VARIANTS_STREAMS", "VARIANTS_KERNEL_CACHE"}, read


@pytest.mark.parametrize("name, value, says", [
    # issue #39's attack: an unusable kernel cache ran without the compiled kernels, silently
    ("VARIANTS_KERNEL_CACHE", "/proc/nope", "is not a folder this process can write"),
    ("VARIANTS_KERNEL_CACHE", "{file}", "is not a folder this process can write"),
    # and a million streams ended in a traceback ("Resource temporarily unavailable") after 21 s
    ("VARIANTS_STREAMS", "1000000", "is more than 64 streams; pass a whole number from 1 to 64"),
])
def test_an_unusable_open_ended_value_is_refused_in_one_line(tmp_path, capsys, monkeypatch,
                                                             name, value, says):
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value.format(file=afile))
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"variants: error: {name}=") and says in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_kernel_cache_folder_that_does_not_exist_yet_is_fine(tmp_path, monkeypatch):
    monkeypatch.setenv("VARIANTS_KERNEL_CACHE", str(tmp_path / "new" / "cache"))
    assert env.problem() is None and list(tmp_path.iterdir()) == []  # nothing left by the probe
