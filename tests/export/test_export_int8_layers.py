"""A quant variant with --int8-layers is refused by ``variants export`` in one line (its W8A8
Linears have no layout the folder loaders read; before, the export wrote a folder that neither
``variants verify`` nor ``load_variant`` could load), exit 2, nothing written."""

from variants.cli import main

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "1", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]


def test_int8_layers_variant_is_refused_in_one_line(tmp_path, capsys):
    assert main(["sweep", "--bits", "8", "--int8-layers", "intermediate", *TINY,
                 "--results-dir", str(tmp_path / "r")]) == 0
    run = next((tmp_path / "r").glob("minilm-sentiment-quant*"))
    name = next(p.name for p in run.iterdir() if p.name.startswith("q8-g64-int8-"))
    capsys.readouterr()
    code = main(["export", str(run), "--variant", name, "--out", str(tmp_path / "out"),
                 "--allow-fail"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert (f"{name}: a quant variant with --int8-layers does not export (its W8A8 Linears have "
            "no layout the folder loaders read); export a variant without --int8-layers") in err
    assert not (tmp_path / "out").exists()
