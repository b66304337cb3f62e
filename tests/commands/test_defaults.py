"""One set of command-line defaults (variants.defaults), shown in every --help, and a family's
flag refused when another --family is swept.

``variants sweep``, ``search`` and ``sensitivity`` are parsed with no flags: what the search's
help calls "as variants sweep" must then hold the sweep's value, the settings the two share
must be equal (and equal to the table), and each flag's help must end with its default (a
switch with none). A flag of another family given on the command line is one line naming the
flag and its family, exit 2, nothing written; a family's defaults never count as given.
"""

import argparse

import pytest

from variants import defaults
from variants.cli import build_parser, main

VERBS = ("sweep", "search", "sensitivity")


def _sub(verb):
    """The ``verb`` subparser and its defaults (parsed with no flags)."""
    parser = build_parser([verb])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb], parser.parse_args([verb])


def test_sweep_search_and_sensitivity_read_one_table():
    _, sweep = _sub("sweep")
    _, search = _sub("search")
    _, sens = _sub("sensitivity")
    table = {"timing_rounds": 50, "timing_warmup": 5, "timing_budget_s": 30.0,
             "timing_batch_sizes": [1, 32], "cold_start": "all", "n_fit": 2000,
             "n_calibration": 800, "n_eval": 800, "seed": 0, "results_dir": "results",
             "group_size": 64, "max_length": None}
    for dest, value in table.items():
        if dest == "n_fit":  # the search's comes from the data (variants.search.sizes)
            assert sweep.n_fit == value and search.n_fit is None
            from variants.search.sizes import BUNDLED

            assert BUNDLED["n_fit"] == value  # on the bundled data: the same 2000
            continue
        assert getattr(sweep, dest) == getattr(search, dest) == value, dest
    assert sweep.timing_min_rounds is None  # 3, or --timing-rounds when fewer (validate)
    # the per-layer sensitivity: one example count, every quant width
    assert search.n_sensitivity == sens.n_examples == defaults.N_SENSITIVITY == 200
    assert sens.bits == list(defaults.QUANT_BITS) == [2, 3, 4, 6, 8]
    # its rows are the search's: the same sizes, None = from the data (variants.search.sizes)
    assert (sens.n_fit, sens.n_search, sens.seed, sens.group_size, sens.max_length) == \
        (search.n_fit, search.n_search, 0, 64, None) == (None, None, 0, 64, None)
    assert sens.n_calibration == search.n_calibration == 800
    assert sens.executor == search.executor == sweep.executor == "local"
    assert sens.workers == search.workers == sweep.workers == 1
    # the search's own widths have their own name (why: variants.defaults)
    assert search.bits == list(defaults.SEARCH_BITS) == [4, 6, 8]
    from variants.families.quant.family import ladder

    assert [c.bits for c in ladder()] == list(defaults.QUANT_BITS)  # a sweep builds them all


def test_the_dataclasses_default_as_the_parsers():
    from variants.search.driver import SearchOptions
    from variants.sweep.config import SweepConfig
    from variants.runtime.timing import DEFAULT_BUDGET_S, DEFAULT_ROUNDS, DEFAULT_WARMUP

    sw, se = SweepConfig(), SearchOptions()
    for k in ("timing_rounds", "timing_warmup", "timing_budget_s", "timing_batch_sizes",
              "cold_start", "n_calibration", "n_eval", "seed", "results_dir",
              "max_length"):
        assert getattr(sw, k) == getattr(se, k), k
    assert se.n_fit is None and se.n_search is None  # from the data (variants.search.sizes)
    assert (DEFAULT_ROUNDS, DEFAULT_WARMUP, DEFAULT_BUDGET_S) == (50, 5, 30.0)


def test_what_search_calls_as_variants_sweep_is_the_sweeps():
    """Every search flag whose help says "as variants sweep" has the sweep flag's default."""
    search_p, search = _sub("search")
    sweep_p, sweep = _sub("sweep")
    said = [a.dest for a in search_p._actions if a.help and "as variants sweep" in a.help]
    assert {"timing_rounds", "timing_warmup", "timing_budget_s", "timing_batch_sizes",
            "cold_start", "n_calibration", "n_eval", "group_size",
            "max_length"} <= set(said)
    assert "n_fit" not in said  # the search's comes from the data (variants.search.sizes)
    for dest in said:
        assert getattr(search, dest) == getattr(sweep, dest), dest
    bits = next(a for a in search_p._actions if a.dest == "bits")
    assert "as variants sweep" not in bits.help and "not a sweep's --bits" in bits.help


@pytest.mark.parametrize("verb", VERBS)
def test_every_flag_shows_its_default_and_no_switch_does(verb):
    p, _ = _sub(verb)
    fmt = p._get_formatter()
    switches = (argparse._StoreTrueAction, argparse._StoreFalseAction)
    for a in p._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        assert a.help, f"{verb} {a.option_strings[0]} has no help"
        shown = fmt._get_help_string(a)
        if isinstance(a, switches):
            assert "%(default)" not in shown, a.option_strings
        else:
            assert "%(default)" in shown, a.option_strings
    text = p.format_help()
    assert "(default: True)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("argv, flag, family", [
    (["--family", "lowrank", "--bits", "8"], "--bits", "quant"),
    (["--family", "prune", "--bits-map", "mixed_4_8"], "--bits-map", "quant"),
    (["--family", "quant", "--ratios", "0.5"], "--ratios", "lowrank"),
    (["--family", "lowrank", "--quantize-head"], "--quantize-head", "quant"),
    (["--family", "lowrank", "--group-size", "64"], "--group-size", "quant"),  # = its default
    (["--family", "quant", "--keep-r", "0.5"], "--keep-ratios", "prune"),  # abbreviated
])
def test_a_flag_of_another_family_is_refused(tmp_path, capsys, argv, flag, family):
    root = tmp_path / "r"
    assert main(["sweep", *argv, "--results-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"variants: error: {flag} is a flag of --family {family}, not of "
                          f"--family {argv[1]}")
    assert f"pass --family {family}" in err
    assert not root.exists()


@pytest.mark.parametrize("argv, family, params", [
    (["--family", "lowrank"], "lowrank", {"ratios": [0.9, 0.7, 0.5, 0.3, 0.1]}),
    (["--family", "quant", "--bits", "8", "--group-size", "32"], "quant",
     {"bits": [8], "group_size": 32}),
    (["--family", "prune", "--prune-bits", "8"], "prune", {"prune_bits": [8]}),
])
def test_own_flags_and_other_families_defaults_pass(argv, family, params):
    from variants.commands.sweep import config_from_args

    full = ["sweep", *argv]
    cfg = config_from_args(build_parser(full).parse_args(full))
    assert cfg.family == family
    for k, v in params.items():
        assert cfg.params[k] == v
    assert "family_flags_given" not in vars(cfg)
