"""The search folder's self-contained ``report.html``: outcome, finalists (judged on the eval
split; their own report is ``final/report.html``), every candidate with how its verdict was
decided (sequential stopping or the whole search split), cost against the tightest clause's
slack as inline SVG, and ``search.json`` embedded unchanged (no MLX)."""

import json
from pathlib import Path


def cost_slack_svg(data):
    """Cost (x) against the tightest clause's slack (y) of every candidate; None without
    any slack."""
    import matplotlib

    from runs.html.charts import RC, VERDICT_STYLE, _figure, to_svg

    pts = [c for c in data.get("candidates", [])
           if c.get("slack") is not None and c.get("cost") is not None]
    if not pts:
        return None
    with matplotlib.rc_context(RC):
        fig = _figure(1, 1, 6.5, 3.6)
        ax = fig.subplots()
        for c in pts:
            m, col = VERDICT_STYLE["pass" if c.get("passed") else (
                "undecided" if c.get("undecided") and not c.get("failed") else "fail")]
            ax.scatter([c["cost"]], [c["slack"]], marker=m, color=col, edgecolor="k", lw=0.4,
                       s=36, alpha=0.5 if c.get("stopped") else 1.0)
        w = data.get("winner")
        if w and w.get("slack") is not None and w.get("cost") is not None:
            ax.scatter([w["cost"]], [w["slack"]], marker="*", s=160, color="gold",
                       edgecolor="k", zorder=5)
        ax.axhline(0, color="0.3", ls="--", lw=0.8)
        ax.set_xlabel(f"cost: {data.get('settings', {}).get('cost', '?')}")
        ax.set_ylabel("slack of the tightest clause")
        ax.grid(alpha=0.25)
        return to_svg(fig, "search-cost-slack")


def render_search_html(data):
    """The search page (str) of a search.json dict (NaN/inf, which Python's json writes, are
    embedded and shown as null / "—")."""
    from markupsafe import Markup

    from runs.html.data import clean
    from runs.html.render import TEMPLATES, _env, embedded_json

    data = clean(data)
    svg = cost_slack_svg(data)
    return _env().get_template("search.html.j2").render(
        d=data, svg=Markup(svg) if svg else None,
        css=Markup((TEMPLATES / "report.css").read_text(encoding="utf-8")),
        data_json=Markup(embedded_json(data)))


def write_search_html(out):
    """Write ``<out>/report.html`` from ``<out>/search.json`` (just written by the search) and
    return its path. A page that cannot be rendered is a failed output, never skipped in
    silence: :class:`runs.io.RunIncomplete` names report.html and why (search.json and search.md
    stay); a write error (disk full, permissions) is raised as it is."""
    from runs.io import RunIncomplete, WriteError, write_text

    out = Path(out)
    try:
        data = json.loads((out / "search.json").read_text(encoding="utf-8"))
        write_text(out / "report.html", render_search_html(data))
        return out / "report.html"
    except WriteError:
        raise
    except Exception as e:  # noqa: BLE001 - one line naming the file
        raise RunIncomplete(out / "report.html", f"{type(e).__name__}: {e}",
                            f"search.json and search.md in {out} are written") from e
