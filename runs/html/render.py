"""Render a run's report dict as one self-contained HTML file (Jinja2, inline CSS and SVG, the
data embedded as one JSON block equal to report.json), and write report.html/report.json."""

import json
import math
from pathlib import Path

#: Templates and the stylesheet (package data of ``runs.html``).
TEMPLATES = Path(__file__).resolve().parent / "templates"
#: id of the ``<script type="application/json">`` element holding the report dict.
DATA_ID = "report-data"


def fmt(x, spec="{:.4g}"):
    """``spec.format(x)``, or "—" for None/NaN (a Jinja filter)."""
    from jinja2 import Undefined

    if x is None or isinstance(x, Undefined) or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return spec.format(x)


def interval(ci, spec="{:.4g}"):
    """"[lo, hi]" of a (low, high) pair; "—" when either side is missing."""
    if not ci or fmt(ci[0]) == "—" or fmt(ci[1]) == "—":
        return "—"
    return f"[{spec.format(ci[0])}, {spec.format(ci[1])}]"


def mb(x):
    """Bytes as megabytes with one decimal, or "—" (a Jinja filter)."""
    return fmt(None if fmt(x) == "—" else x / 1e6, "{:.1f}")


def embedded_json(data):
    """The report dict as the text of a ``<script type="application/json">`` element: JSON
    with every ``<``, ``>`` and ``&`` as a \\u escape (so no ``</script>`` can end it early);
    ``json.loads`` of it equals ``data``."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _env():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    # a key an older run lacks renders as "—" (fmt) or nothing, never an error
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["j2"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["interval"] = interval
    env.filters["mb"] = mb
    return env


def render_html(data, charts=None):
    """The report page (str) of a report dict (:func:`runs.html.build.report_data`).

    Parameters
    ----------
    data : dict
        JSON-ready (finite floats or None).
    charts : dict, optional
        :func:`runs.html.charts.charts` of ``data``; drawn here when not given.
    """
    from markupsafe import Markup

    from runs.html.charts import charts as draw

    charts = draw(data) if charts is None else charts
    safe = {"pareto": [(b, Markup(s)) for b, s in charts["pareto"]],
            "reliability": {k: Markup(s) for k, s in charts["reliability"].items()}}
    css = (TEMPLATES / "report.css").read_text(encoding="utf-8")
    js = (TEMPLATES / "report.js").read_text(encoding="utf-8")
    return _env().get_template("report.html.j2").render(
        d=data, charts=safe, css=Markup(css), js=Markup(js), data_id=DATA_ID,
        data_json=Markup(embedded_json(data)))


def write_html_report(run_dir, *, variants=None, evaluations=None, out_dir=None, texts=None,
                      status=None):
    """Write ``report.html`` and the run-level ``report.json`` (the dict embedded in it) into
    ``out_dir`` (default the run folder), each atomically.

    Parameters
    ----------
    run_dir : path-like or runs.folder.RunFolder
        A finished sweep folder.
    variants : list of str, optional
        Only these variants (a model card: one).
    evaluations : dict of str -> metrics.evaluate.Evaluation, optional
        The judge's evaluations (not recomputed).
    out_dir : path-like, optional
        Where both go; each variant's verdict.json and report.json are read from here when
        present (``variants check --output-dir`` writes them there), else from the run folder.
    texts : mapping of id -> str, optional
    status : str, optional
        The run's status to show (the sweep's final one, which run.json gets last); default
        run.json's.

    Returns
    -------
    Path
        The report.html written.

    Raises
    ------
    runs.plots.data.PlotError, runs.readers.CorruptFileError
        As :func:`runs.html.build.report_data` (nothing is written then).
    runs.io.WriteError
        A file could not be written.
    """
    from runs.html.build import dumps, report_data
    from runs.io import write_text

    out = Path(out_dir) if out_dir is not None else Path(getattr(run_dir, "path", run_dir))
    data = report_data(run_dir, variants=variants, evaluations=evaluations, texts=texts,
                       judged_dir=out, status=status)
    page = render_html(data)
    write_text(out / "report.json", dumps(data) + "\n")
    write_text(out / "report.html", page)
    return out / "report.html"


def write_beside_markdown(run_dir, *, out_dir=None, evaluations=None, status=None,
                          said="run.json says incomplete"):
    """:func:`write_html_report` where report.md was just written (the sweep and ``variants
    check``). A report that cannot be rendered is a failed output, never skipped in silence:
    it raises :class:`runs.io.RunIncomplete` naming report.html and why (the caller's report.md
    and run files stay; ``said`` is what they say, in that error's one line); a write error
    (disk full, permissions) is raised as it is. Returns the path."""
    from runs.io import RunIncomplete, WriteError

    out = Path(out_dir) if out_dir is not None else Path(getattr(run_dir, "path", run_dir))
    try:
        return write_html_report(run_dir, out_dir=out_dir, evaluations=evaluations,
                                 status=status)
    except WriteError:
        raise
    except Exception as e:  # noqa: BLE001 - one line naming the file; report.md stays valid
        raise RunIncomplete(out / "report.html", f"{type(e).__name__}: {e}", said) from e
