"""The family interface: every registered family fills variants.families.family.Family
the same way — its flags' dests are its params, its ladder's configs are of its config class with
distinct names, its build reads only BuildInputs fields — and BuildInputs.only keeps what it
names."""

import argparse
from dataclasses import fields

import pytest

from variants.families import FAMILIES, get_family
from variants.families.family import BuildInputs, Family


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_fills_the_interface(name):
    fam = get_family(name)
    assert isinstance(fam, Family) and fam.name == name
    parser = argparse.ArgumentParser()
    before = {a.dest for a in parser._actions}
    fam.add_arguments(parser)
    dests = {a.dest for a in parser._actions} - before
    assert dests == set(fam.params)
    defaults = {k: v for k, v in vars(parser.parse_args([])).items() if k in fam.params}
    configs = fam.ladder(**defaults)
    assert configs and all(type(c) is fam.config for c in configs)
    assert len({c.name for c in configs}) == len(configs)
    assert isinstance(fam.run_name(**defaults), str) and fam.run_name(**defaults)
    assert set(fam.inputs) <= {f.name for f in fields(BuildInputs)}
    assert callable(fam.build) and callable(fam.check_model) and callable(fam.describe)


def test_quant_ladder_and_names_from_the_flags():
    fam = get_family("quant")
    parser = argparse.ArgumentParser()
    fam.add_arguments(parser)
    args = vars(parser.parse_args(["--bits", "8", "4", "8", "--group-size", "32"]))
    configs = fam.ladder(**{k: args[k] for k in fam.params})
    assert [c.name for c in configs] == ["q8-g32", "q4-g32"]  # duplicates dropped, order kept
    assert fam.run_name(**{k: args[k] for k in fam.params}) == "g32"


def test_build_inputs_only_keeps_the_named_fields():
    full = BuildInputs(calibration="cal", fit="fit", cache_dir="cache")
    assert full.only(("calibration",)) == BuildInputs(calibration="cal")
    assert full.only(("calibration", "fit", "cache_dir")) == full
    assert full.only(()) == BuildInputs()


def test_unknown_family_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown variant family 'nope'; choose one of: quant, "
                                         "lowrank, prune, exit"):
        get_family("nope")
