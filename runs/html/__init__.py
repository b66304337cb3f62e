"""The run's self-contained HTML report: ``report.html`` (inline CSS, inline SVG charts, the
data embedded as one JSON block) and the run-level ``report.json`` it embeds (no MLX).

:func:`write_html_report` writes both for a sweep folder, or for a subset of its variants (a
model card is the report of one variant); :func:`report_data` and :func:`render_html` are the
two halves.
"""

from runs.html.build import report_data
from runs.html.notebook import show_report
from runs.html.render import render_html, write_html_report

__all__ = ["report_data", "render_html", "show_report", "write_html_report"]
