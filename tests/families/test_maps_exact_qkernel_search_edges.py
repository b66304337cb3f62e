"""Edge cases of the exact family, qkernel, --ratio-map and search:
each test failed before its fix."""

import hashlib
from importlib import resources
from types import SimpleNamespace

import pytest

from variants.families.exact import family as exact_family
from variants.layer_maps import ratio_map

PATHS = [f"encoder.layers.{i}.{n}" for i in range(2)
         for n in ("attention.query", "intermediate", "output")]


def test_ratio_map_shadowed_pattern_is_refused():
    # 'layers' matches every layer first, so 'intermediate' would silently set nothing
    with pytest.raises(ValueError, match=r"--ratio-map pattern 'intermediate' sets no layer.*"
                                         r"'layers'"):
        ratio_map.resolve("layers=0.5,intermediate=0.3", PATHS, 0.9)
    # narrower first: both set layers (first match wins), the rest get the default
    got = ratio_map.resolve("intermediate=0.3,layers\\.0\\.=0.5", PATHS, 0.9)
    assert got == {"encoder.layers.0.attention.query": 0.5, "encoder.layers.0.intermediate": 0.3,
                   "encoder.layers.0.output": 0.5, "encoder.layers.1.attention.query": 0.9,
                   "encoder.layers.1.intermediate": 0.3, "encoder.layers.1.output": 0.9}


def test_qkernel_cache_that_is_a_file_falls_back_without_traceback(tmp_path, monkeypatch,
                                                                    capsys):
    from variants.runtime import qkernel

    f = tmp_path / "afile"
    f.write_text("garbage")
    monkeypatch.setenv(qkernel.ENV_CACHE, str(f))
    path, why = qkernel.build()
    assert path is None and "unusable" in why and qkernel.ENV_CACHE in why
    assert qkernel.main([]) == 1
    assert "not built" in capsys.readouterr().err


def test_qkernel_main_reports_a_corrupt_cached_build(tmp_path, monkeypatch, capsys):
    from variants.runtime import qkernel

    monkeypatch.setenv(qkernel.ENV_CACHE, str(tmp_path))
    target = qkernel._target(tmp_path / qkernel.key())
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not an ELF file")
    assert qkernel.main([]) == 1  # was: "qkernel: ok" for a file that cannot load
    err = capsys.readouterr().err
    assert "cannot load" in err and "--force" in err


def _cfg(seed=0, **params):
    return SimpleNamespace(seed=seed, params=params)


def test_exact_workloads_timed_with_other_settings_are_stale():
    timing = {"workloads": {"settings": {"batch_size": 32, "calls": 20, "zipf_exponent": 1.1,
                                         "seed": 0, "n_eval": 60}}}
    cache = exact_family.ExactConfig("cache", 8)
    same = _cfg(zipf_exponent=1.1, workload_calls=20, workload_batch=32)
    assert exact_family.extra_stale(timing, same, cache) is None
    assert exact_family.extra_stale(timing, _cfg(), cache) is None  # the defaults
    why = exact_family.extra_stale(timing, _cfg(zipf_exponent=3.0, workload_calls=5), cache)
    assert "'zipf_exponent': (1.1, 3.0)" in why and "'calls': (20, 5)" in why
    assert "batch_size" not in why
    assert "seed" in exact_family.extra_stale(timing, _cfg(seed=1), cache)
    assert exact_family.extra_stale({}, same, cache) is not None  # no workloads saved
    assert exact_family.extra_stale({}, same, exact_family.ExactConfig("outsel")) is None


def test_search_options_dedupe_families_and_check_finalize_settings_first():
    from variants.search.driver import SearchOptions

    assert SearchOptions(families=("quant", "quant")).validate().families == ("quant",)
    for kw, flag in ((dict(cold_start="foo"), "cold_start"),
                     (dict(timing_rounds=0), "--timing-rounds"),
                     (dict(timing_budget_s=-1.0), "--timing-budget-s")):
        with pytest.raises(ValueError, match=flag):
            SearchOptions(**kw).validate()
    SearchOptions(cold_start="foo", finalize=False).validate()  # no finalists: not used


def test_search_contract_digest_takes_packaged_names():
    from variants.search.driver import _contract_digest

    def sha(name):
        return hashlib.sha256(resources.files("contracts").joinpath(f"{name}.toml")
                              .read_bytes()).hexdigest()

    assert _contract_digest("strict") == sha("strict") != _contract_digest("lenient")
    assert _contract_digest(None) is None


def test_bits_map_shadowed_pattern_is_refused_like_the_ratio_map():
    from variants.layer_maps import bits_map

    paths = ["encoder.layers.0.attention.value", "encoder.layers.0.intermediate"]
    with pytest.raises(ValueError, match=r"--bits-map pattern 'intermediate' sets no layer: .*"
                                         r"'layers'"):
        bits_map.resolve("layers=8,intermediate=4", paths, 6, 64)
    assert bits_map.resolve("intermediate=4,layers=8", paths, 6, 64) == {
        paths[0]: (8, 64), paths[1]: (4, 64)}


@pytest.mark.parametrize("flag, value", [("workload_batch", 100_000), ("workload_calls", 10**6),
                                         ("workload_batch", 0)])
def test_exact_workload_sizes_are_bounded(flag, value):
    from variants.families.exact.family import ladder

    with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} {value} must be an integer "
                                         r"in \[1, "):
        ladder(**{flag: value})
