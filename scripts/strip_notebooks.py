"""Strip outputs and execution counts from notebooks/*.ipynb in place (nbstripout-style).

Usage: python scripts/strip_notebooks.py [NOTEBOOK ...]   (default: every notebooks/*.ipynb)
"""

import sys
from pathlib import Path

import nbformat


def strip(path):
    """Remove outputs, execution counts and per-run metadata; return True if the file changed."""
    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    after = nbformat.writes(nb)
    if after != before:
        Path(path).write_text(after, encoding="utf-8")
    return after != before


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    paths = sys.argv[1:] or sorted((root / "notebooks").glob("*.ipynb"))
    for p in paths:
        if strip(p):
            print(f"stripped {p}")
