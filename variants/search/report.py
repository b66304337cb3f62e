"""The search's results: ``search.json`` (every candidate), ``search.md`` (the path taken, the
winner, the Pareto front of cost vs the tightest clause's slack) and ``search.png``. No MLX.

A clause's slack is how far the compared number is inside its bound, relative to the bound:
``(threshold - x) / |threshold|`` for a max, ``(x - threshold) / |threshold|`` for a min (the
raw difference when the threshold is 0); negative = failing. The tightest clause is the one
with the smallest slack. For a candidate stopped early the slacks are of the best-case
completion (:mod:`variants.search.sequential`): upper bounds.
"""

import json
import math

import pandas as pd

from runs.html import search as html_search
from runs.io import write_json, write_text
from variants.search.amdahl import markdown as amdahl_md
from variants.search.costs import UNITS


def slack(op, threshold, value):
    """Relative slack of one clause (module docstring); None for a NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    d = (threshold - value) if op == "<=" else (value - threshold)
    if not threshold:  # no scale: a passing zero bound (count <= 0) is never the tightest
        return None if d >= 0 else d
    return d / abs(threshold)


def tightest(verdict, only=None):
    """``(clause id, slack)`` of the clause with the smallest slack of a Verdict (clauses with
    no examples left out; only the ids in ``only`` when given); ``(None, None)`` when none has
    a number."""
    best = (None, None)
    for r in verdict.results:
        if r.passed is None or (only is not None and r.id not in only):
            continue
        s = slack(r.op, r.threshold, r.compared_value)
        if s is not None and (best[1] is None or s < best[1]):
            best = (r.id, s)
    return best


def pareto(frame, cost="cost"):
    """Rows of ``frame`` not dominated in (lower ``cost``, higher ``slack``), by cost."""
    f = frame.dropna(subset=["slack"]).sort_values([cost, "slack"], ascending=[True, False])
    keep, best = [], -math.inf
    for i, row in f.iterrows():
        if row["slack"] > best:
            keep.append(i)
            best = row["slack"]
    return f.loc[keep]


def frame_of(records):
    """One row per candidate record, in evaluation order (pandas)."""
    cols = ["step", "id", "name", "cost", "bits_per_weight", "model_bytes", "passed", "failed",
            "undecided", "tightest", "slack", "n_used", "n_total", "stopped", "wall_s", "reused"]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in records], columns=cols)


def write_all(out, result):
    """search.json, search.md and search.png in ``out``; returns their paths."""
    write_json(out / "search.json", result)
    frame = frame_of(result["candidates"])
    png = out / "search.png"
    try:
        plot(frame, result, png)
    except Exception as e:  # a plotting failure does not lose the results
        result["plot_error"] = f"{type(e).__name__}: {e}"
        png = None
    write_text(out / "search.md", markdown(frame, result, png))
    html_search.write_search_html(out)  # report.html: the search as one self-contained page
    return out / "search.json", out / "search.md", png


def _mb(b):
    return f"{b / 1e6:.2f} MB"


def markdown(frame, result, png):
    s = result["settings"]
    unit = UNITS[s["cost"]]
    lines = [f"# variants search: {s['model'] or 'minilm-sentiment'}, cost {s['cost']}, "
             f"strategy {s['strategy']}", ""]
    t = result["totals"]
    lines += [f"{t['candidates']} candidates ({t['evaluated']} evaluated now, {t['reused']} "
              f"reused from an earlier run); search split {s['n_search']} rows "
              f"({t['n_search_calibration']} calibration, {t['n_search_eval']} eval). "
              f"Sequential stopping ran {t['examples_used']} of {t['examples_full']} search-eval "
              f"examples ({t['examples_saved_share']:.0%} saved, about {t['saved_s']:.1f} s); "
              f"wall {t['wall_s']:.1f} s.", ""]
    parts = t.get("parts_s") or {}
    if parts:
        lines += ["| part | wall s | share |", "|---|---:|---:|"]
        lines += [f"| {k} | {v:.1f} | {v / t['wall_s']:.0%} |" for k, v in parts.items()]
        rest = t["wall_s"] - sum(parts.values())
        lines += [f"| other (writing, judging) | {rest:.1f} | {rest / t['wall_s']:.0%} |", ""]
    rows = t.get("sensitivity_rows") or {}
    if rows:  # the cache shared with variants sensitivity (variants.search.sens_cache)
        lines += [f"Per-layer sensitivity: {rows['read']} rows read from the shared cache, "
                  f"{rows['measured']} measured on executor {result['executor']['kind']} x "
                  f"{result['executor']['workers']}.", ""]
    if result.get("kept"):
        lines += ["Kept as they are (not units of the search): "
                  + "; ".join(f"`{p}` ({why})" for p, why in result["kept"]), ""]
    lines += ["## Outcome", "", result["outcome"], ""]
    if result.get("finalists"):
        lines += ["| finalist | bits/weight | model | search split | eval split | "
                  "failing on eval |", "|---|---|---|---|---|---|"]
        for f in result["finalists"]:
            lines.append(f"| {f['name']} | {f['bits_per_weight']:.3f} | {_mb(f['model_bytes'])} "
                         f"| PASS | {_eval_word(f)} | "
                         f"{', '.join(f['failed_eval'] + f.get('undecided_eval', [])) or '-'} |")
        if any(f.get("measured_speedup") is not None for f in result["finalists"]):
            lines += ["", "Speed-up over the reference at the cost's batch size: predicted by the "
                      "latency model, measured in strict alternation (the finalists' sweep).", "",
                      "| finalist | predicted | measured |", "|---|---:|---:|"]
            lines += [f"| {f['name']} | {f['predicted_speedup']:.2f}× | "
                      + (f"{f['measured_speedup']:.2f}× |" if f.get("measured_speedup")
                         else "— |") for f in result["finalists"]]
        held = sum(bool(f["passed_eval"]) for f in result["finalists"])
        lines += ["", f"{held} of {len(result['finalists'])} search-split passes held on the "
                  f"eval split ({held / len(result['finalists']):.0%}).", ""]
        lines += side_by_side(result["finalists"], s.get("select", "value"))
        lines.append("")
    w = result.get("winner")
    if w and set(w.get("config", {"quant": 0})) != {"quant"}:  # composed (--strategy optuna)
        lines += ["## Winner's configuration", "", f"`{json.dumps(w['config'])}`", ""]
    elif w:
        flags = (" --quantize-embeddings" if s.get("quantize_embeddings") else "") + \
            (" --quantize-head" if s.get("quantize_head") else "") + \
            (f" --quant-method {w['method']}" if w.get("method", "rtn") != "rtn" else "") + \
            (f" --int8-layers '{w['int8']}'" if w.get("int8") else "") + \
            (f" --scale-dtype {s['scale_dtype']}" if s.get("scale_dtype", "float32")
             != "float32" else "") + \
            (f" --embedding-texts '{s['embedding_texts']}'" if s.get("embedding_texts") else "")
        lines += ["## Winner's per-layer bits", "", "As a sweep variant: `variants sweep --bits "
                  f"{w['default_bits']}{flags}" + (f" --bits-map '{w['bits_map']}'`"
                                                   if w["bits_map"] else "`"),
                  "", "| layer | bits |", "|---|---|"]
        lines += [f"| {p} | {b} |" for p, b in w["layer_bits"].items()]
        lines.append("")
    am = result.get("amdahl")
    if am and "skipped" in am:
        lines += ["## Amdahl", "", f"No Amdahl table: {am['skipped'].rstrip('.')}.", ""]
    elif am:
        lines += amdahl_md(am, am.get("batch_size"))
    if result.get("workload"):
        from variants.search.workload_price import markdown as workload_md

        lines += workload_md(result["workload"])
    lines += ["## Path taken", "", f"cost in {unit}; slack of the tightest clause (negative = "
              "failing; for stopped candidates a bound)", "",
              "| step | candidate | cost | bits/weight | verdict | failing | tightest (slack) | "
              "examples | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for _, r in frame.iterrows():
        verdict = ("over budget" if not r["passed"] and r["n_used"] == 0
                   else record_word(r))
        sl = "" if r["slack"] is None or pd.isna(r["slack"]) else f"{r['slack']:+.3f}"
        lines.append(f"| {r['step']} | {r['name']} | {r['cost']:.6g} | {r['bits_per_weight']:.3f}"
                     f" | {verdict}{' (stopped)' if r['stopped'] else ''} | "
                     f"{', '.join(_ids(r, 'failed') or _ids(r, 'undecided')) or '-'} | "
                     f"{r['tightest'] or '-'} ({sl}) | "
                     f"{r['n_used']}/{r['n_total']} | {r['wall_s']:.1f} |")
    front = pareto(frame)
    lines += ["", "## Pareto front (cost vs tightest-clause slack)", "",
              "| candidate | cost | slack | verdict |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['cost']:.6g} | {r['slack']:+.3f} | "
              f"{record_word(r)} |" for _, r in front.iterrows()]
    if png is not None:
        lines += ["", f"![cost vs slack]({png.name})"]
    return "\n".join(lines) + "\n"


def _eval_word(finalist):
    """'PASS', 'FAIL' or 'UNDECIDED' of a finalist on the eval split."""
    if finalist["passed_eval"]:
        return "PASS"
    return "UNDECIDED" if finalist.get("undecided_eval") and not finalist["failed_eval"] else "FAIL"


def _ids(rec, key):
    """The clause ids of a record's ``key`` list (a missing or NaN cell: none)."""
    v = rec.get(key)
    return list(v) if isinstance(v, (list, tuple)) else []


def record_word(rec):
    """'PASS', 'FAIL' or 'UNDECIDED' (no clause failed, one or more undecided) of a search
    record (a dict or a frame row)."""
    if rec["passed"]:
        return "PASS"
    return "UNDECIDED" if _ids(rec, "undecided") and not _ids(rec, "failed") else "FAIL"


def _cell(c):
    if not c or c.get("value") is None:
        return "—"
    lo, hi = (c.get("ci") or [c.get("ci_low"), c.get("ci_high")])[:2]
    ci = f" [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else ""
    return f"{c['value']:.4g}{ci} {c['status']}"


def side_by_side(finalists, select):
    """Markdown: per finalist, each clause's value [interval] and verdict on the search split
    (judged by ``select``: the bound or the value) and on the eval split (the contract as
    written)."""
    lines = []
    for f in finalists:
        ids = list(dict.fromkeys([*f.get("clauses_search", {}), *f.get("clauses_eval", {})]))
        if not ids:
            continue
        lines += [f"**{f['name']}**: search split (judged on the {select}) vs eval split", "",
                  "| clause | threshold | search split | eval split |", "|---|---|---|---|"]
        for i in ids:
            se, ev = f.get("clauses_search", {}).get(i), f.get("clauses_eval", {}).get(i)
            c = se or ev
            lines.append(f"| {i} | {c['op']} {c['threshold']:g} | {_cell(se)} | "
                         f"{_cell(ev)} |")
        lines.append("")
    return lines


def plot(frame, result, path):
    """Scatter of cost vs tightest-clause slack (pass / fail), the Pareto front and the winner."""
    import seaborn as sns
    from matplotlib.figure import Figure

    f = frame.dropna(subset=["slack"]).assign(
        verdict=lambda d: [record_word(r).lower() for _, r in d.iterrows()])
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    sns.scatterplot(data=f, x="cost", y="slack", hue="verdict", style="stopped", ax=ax,
                    palette={"pass": "tab:green", "fail": "tab:red", "undecided": "tab:orange"})
    front = pareto(frame)
    ax.step(front["cost"], front["slack"], where="post", color="0.4", lw=1, label="Pareto front")
    ax.axhline(0, color="0.2", lw=0.8, ls="--")
    w = result.get("winner")
    if w:
        ax.scatter([w["cost"]], [w["slack"]], marker="*", s=220, color="gold",
                   edgecolor="black", zorder=5, label="winner")
    s = result["settings"]
    ax.set_xlabel(f"cost: {s['cost']} ({UNITS[s['cost']]})")
    ax.set_ylabel("slack of the tightest clause (search split)")
    ax.set_title(f"variants search ({s['strategy']}): {len(frame)} candidates", fontsize=10)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path
