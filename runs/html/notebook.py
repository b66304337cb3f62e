"""A run's report.html inside a Jupyter notebook: the page in an ``<iframe srcdoc>``, so its
CSS and script stay inside the frame and nothing is fetched (no MLX)."""

import html
from pathlib import Path


def iframe(page, *, height=900):
    """``<div><iframe srcdoc=...></div>`` markup (str) holding the HTML ``page`` (str),
    ``height`` in px (the div: IPython warns about a bare iframe)."""
    return (f'<div><iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: '
            f'{int(height)}px; border: 1px solid #d1d9e0" title="variants report"></iframe></div>')


def show_report(run_dir, *, height=900):
    """``IPython.display.HTML`` of the run's report.html (written by the sweep or ``variants
    check``), for a notebook cell.

    Raises
    ------
    FileNotFoundError
        The run has no report.html; ``variants check RUN`` writes it.
    """
    from IPython.display import HTML

    path = Path(run_dir) / "report.html"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `variants check {run_dir}` to write it")
    return HTML(iframe(path.read_text(encoding="utf-8"), height=height))
