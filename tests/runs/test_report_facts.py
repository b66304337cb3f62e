"""What the run report states besides its tables (runs.report_facts): layers a quantizer left in
full precision because the group size does not divide their input size, with their share of the
parameters, shown in report.md and summary.csv (not only in build.json)."""

import json
import shutil
from pathlib import Path

import pandas as pd

from runs.report_facts import unquantized_cells, unquantized_text
from variants.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures"
SKIPS = [["encoder.embeddings.word_embeddings", "embeddings kept full precision"],
         ["encoder.layers.0.output", "input size 1536 not divisible by group size 100"],
         ["encoder.layers.1.output", "input size 1536 not divisible by group size 100"],
         ["head", "decision head kept full precision"]]


def test_cells_count_only_indivisible_layers_and_their_share():
    build = {"skipped": SKIPS, "total_params": 1000,
             "skipped_weights": {"encoder.layers.0.output": 30, "encoder.layers.1.output": 20,
                                 "head": 5, "encoder.embeddings.word_embeddings": 400}}
    cells = unquantized_cells(build)
    assert cells == {"unquantized_layers": 2,
                     "unquantized_paths": "encoder.layers.0.output;encoder.layers.1.output",
                     "unquantized_param_share": 0.05}  # (30 + 20) / 1000
    assert unquantized_text(cells) == (
        "; **left unquantized** (input size not divisible by the group size): 2 layers, 5.0% of "
        "the parameters: `encoder.layers.0.output`, `encoder.layers.1.output`")
    # a family composing quantization keeps the quantizer's record under "quant"
    assert unquantized_cells({"quant": build}) == cells
    # a build.json from before the weight counts: the layers, the share not recorded
    old = unquantized_cells({"skipped": SKIPS, "total_params": 1000})
    assert old["unquantized_param_share"] is None
    assert "share of the parameters not recorded" in unquantized_text(old)
    assert unquantized_cells({"skipped": SKIPS[:1]}) == {} and unquantized_cells({}) == {}
    assert unquantized_text({}) == ""


def test_check_shows_the_skips_in_report_md_and_summary_csv(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "sweep_small", run)
    path = run / "q4-g64" / "build.json"
    build = json.loads(path.read_text())
    build["skipped"] = build["skipped"] + [SKIPS[1]]
    build["skipped_weights"] = {"encoder.layers.0.output": 1536 * 384}
    path.write_text(json.dumps(build))
    assert main(["check", str(run), "--output-dir", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    share = 1536 * 384 / build["total_params"]
    want = (f"**left unquantized** (input size not divisible by the group size): 1 layer, "
            f"{share:.1%} of the parameters: `encoder.layers.0.output`")
    assert report.count(want) == 1 and f"{share:.1%}" == "2.6%"
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("variant")
    assert summary.loc["q4-g64", "unquantized_layers"] == 1
    assert summary["unquantized_layers"].isna().sum() == 2  # q2 and q8 have none


def test_the_head_kept_full_precision_is_stated_with_why():
    build = {"skipped": [["head", "decision head (outside the encoder) kept full precision"]],
             "head": {"paths": ["head"], "why": "decision head (outside the encoder)",
                      "quantized": False}}
    cells = unquantized_cells(build)
    assert cells == {"head_kept": "head", "head_kept_why": "decision head (outside the encoder)"}
    assert unquantized_text(cells) == \
        "; kept full precision: decision head (outside the encoder): `head`"
    quantized = dict(build, head=dict(build["head"], quantized=True))
    assert unquantized_cells(quantized) == {} and unquantized_text({}) == ""
