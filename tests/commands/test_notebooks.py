"""The comparison notebooks run top to bottom, headless, on the saved small sweeps."""

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).parents[2]
NOTEBOOKS = ROOT / "notebooks"
FIXTURES = Path(__file__).parents[1] / "fixtures"
PARAMETERS = {
    "compare_variants.ipynb": {"RUN_DIRS": [str(FIXTURES / "sweep_small"),
                                            str(FIXTURES / "sweep_small_choice")]},
    "calibration.ipynb": {"RUN_DIR": str(FIXTURES / "sweep_small_choice")},
    "near_ties.ipynb": {"RUN_DIR": str(FIXTURES / "sweep_small"), "TOP": 5},
}


def _parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "each notebook has exactly one cell tagged 'parameters'"
    return cells[0]


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(PARAMETERS)


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_notebook_outputs_are_stripped(name):
    """Notebooks are stored without outputs (see notebooks/README.md)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{name} has outputs; run `python scripts/strip_notebooks.py`")


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_notebook_runs_headless(name, tmp_path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cell = _parameters_cell(nb)
    # Papermill-style injection: keep the defaults, then override them.
    cell.source += "\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in PARAMETERS[name].items())
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    if name != "near_ties.ipynb":
        assert any("image/png" in o.get("data", {}) for o in outputs), "no figure displayed"
