"""variants search's split sizes from the user's data: half the fit-split rows for the search
(the rest for a fitted head), all of them for a model that fits nothing, the bundled sizes
without --data, and a one-line refusal naming a command that works on a too-small file."""

import json

import pytest

from variants.search import sizes
from variants.search.driver import SearchOptions

DATA = "examples/vader_raters.jsonl"  # 300 rows, 163 in the fit split


def _resolve(**kw):
    from variants.sweep.config import SweepConfig

    opts = SearchOptions(**kw)
    said = []
    src = SweepConfig(model=opts.model, model_config=opts.model_config).resolve_model()
    sizes.resolve(opts, src, log=said.append)
    return opts, said


def test_fitted_head_gets_half_for_the_search():
    opts, said = _resolve(model_config="examples/model-marker.toml", data=DATA)
    assert (opts.n_search, opts.n_fit) == (81, 82)  # 163 // 2, and the rest
    assert said == [f"sizes from {DATA}: 163 fit-split rows -> --n-search 81, --n-fit 82 for "
                    "the head"]


def test_nothing_to_fit_takes_every_fit_row():
    opts, said = _resolve(model_config="examples/model-cosine.toml", data=DATA)
    assert (opts.n_search, opts.n_fit) == (163, 0)
    assert "the model fits nothing" in said[0]


def test_a_learned_quantizer_takes_fit_rows_where_the_model_fits_nothing():
    opts, said = _resolve(model_config="examples/model-cosine.toml", data=DATA,
                          quant_methods=("rtn", "gptq"))
    assert (opts.n_search, opts.n_fit) == (81, 82)
    assert said[0].endswith("--n-search 81, --n-fit 82 for the learned quantizers")
    opts, said = _resolve(model_config="examples/model-marker.toml", data=DATA,
                          quant_methods=("dwq",))
    assert said[0].endswith("--n-fit 82 for the head and the learned quantizers")


def test_given_sizes_and_bundled_defaults():
    opts, _ = _resolve(model_config="examples/model-linear-head.toml", data=DATA, n_fit=100)
    assert (opts.n_search, opts.n_fit) == (63, 100)
    opts, said = _resolve()
    assert (opts.n_search, opts.n_fit) == (1600, 2000) and said == []


def test_too_few_rows_names_a_command_that_works(tmp_path, capsys):
    from variants.cli import main

    data = tmp_path / "few.jsonl"
    rows = [{"text": f"row {i} is fine", "label": i % 3, "split": "fit" if i < 30 else
             ("calibration" if i < 60 else "eval")} for i in range(90)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "s"
    assert main(["search", "--model-config", "examples/model-linear-head.toml", "--data",
                 str(data), "--out", str(out), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"data file {data} has 30 fit-split rows; the search needs 50 or more" in err
    assert f"variants sweep --data {data} --model-config examples/model-linear-head.toml" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_zero_fit_rows_is_a_valid_sweep_size():
    from variants.sweep.config import SweepConfig, SweepError

    SweepConfig(n_fit=0).validate()
    with pytest.raises(SweepError, match="--n-fit 5 is too small; pass --n-fit 10 or more"):
        SweepConfig(n_fit=5).validate()
