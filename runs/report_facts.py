"""Facts the run report states next to its tables, so that nothing it measured or skipped is
left only in a JSON file: texts the model read nothing of (with their row ids), layers a
quantizer left in full precision (with their share of the parameters), timings faster than
their work allows (``variants.sweep.plausible``), the CPU measured on and which model each
verdict belongs to (``variants.sweep.timed_check``). No MLX."""

import math

import numpy as np
import pandas as pd

#: The reason prefix of a layer left unquantized because the group size does not divide its input
#: size (``variants.families.quant.build.INDIVISIBLE``; repeated here: the judging side imports no
#: builder).
INDIVISIBLE = "input size"

#: Row ids listed per split in the data line; the rest are counted ("… and N more").
MAX_LISTED_IDS = 20


def special_only_text(data):
    """"; texts that are special tokens only (kept and judged): eval 2 (ids …)" from run.json's
    ``data.special_only_texts`` and ``special_only_ids`` (ids absent in older runs)."""
    counts = data.get("special_only_texts")
    if counts is None:
        return ""
    ids = data.get("special_only_ids") or {}
    parts = []
    for split, n in counts.items():
        listed = ids.get(split) or []
        more = f" and {len(listed) - MAX_LISTED_IDS} more" if len(listed) > MAX_LISTED_IDS else ""
        parts.append(f"{split} {n}" + (f" (ids {', '.join(map(str, listed[:MAX_LISTED_IDS]))}"
                                        f"{more})" if listed else ""))
    return "; texts that are special tokens only (kept and judged): " + ", ".join(parts)


def _skip_record(build):
    """(skipped [(path, reason)], skipped_weights {path: n} or None, total params or None) of a
    build.json: the quant family's own fields, or the ``quant`` block of a family that composes
    quantization (prune, low rank, exit with bits)."""
    for d in (build, build.get("quant") or {}):
        if "skipped" in d:
            return d["skipped"], d.get("skipped_weights"), d.get("total_params")
    return [], None, None


def unquantized_cells(build):
    """summary.csv cells for the layers left unquantized because the group size does not divide
    their input size: ``unquantized_layers`` (count), ``unquantized_paths`` (";"-joined) and
    ``unquantized_param_share`` (their weight elements / all the module's parameters; None when
    build.json predates the weight counts); and the decision head kept full precision
    (``head_kept``: its paths, ";"-joined; ``head_kept_why``: how it was found) when build.json
    records it. Empty when there is none (no column is added)."""
    skipped, weights, total = _skip_record(build)
    paths = [p for p, why in skipped if str(why).startswith(INDIVISIBLE)]
    head = build.get("head") or (build.get("quant") or {}).get("head")
    kept = {}
    if head and not head.get("quantized") and head.get("paths"):
        kept = {"head_kept": ";".join(head["paths"]), "head_kept_why": head.get("why", "")}
    if not paths:
        return kept
    share = None
    if weights is not None and total:
        share = sum(weights[p] for p in paths) / total
    return {"unquantized_layers": len(paths), "unquantized_paths": ";".join(paths),
            "unquantized_param_share": share, **kept}


def unquantized_text(r):
    """"; left unquantized (input size not divisible by the group size): 2 layers, 3.1% of the
    parameters: a, b" from a summary row; "" when the row has none."""
    head = r.get("head_kept")
    kept = (f"; kept full precision: {str(r.get('head_kept_why') or 'decision head')}: "
            + ", ".join(f"`{p}`" for p in str(head).split(";"))
            if isinstance(head, str) and head else "")
    n = r.get("unquantized_layers")
    if n is None or (isinstance(n, float) and math.isnan(n)) or not n:
        return kept
    share = r.get("unquantized_param_share")
    share_text = ("share of the parameters not recorded" if share is None
                  or (isinstance(share, float) and math.isnan(share))
                  else f"{share:.1%} of the parameters")
    return (f"; **left unquantized** (input size not divisible by the group size): {int(n)} "
            f"layer{'s' if n != 1 else ''}, {share_text}: "
            + ", ".join(f"`{p}`" for p in str(r["unquantized_paths"]).split(";")) + kept)


def plausibility_cells(prefix, entry):
    """summary.csv cells ``<prefix>implausible`` (bool) and ``<prefix>implausible_reasons``
    ("; "-joined) of one timing.json entry; {} for an entry timed before the check existed."""
    p = entry.get("plausibility")
    if p is None:
        return {}
    return {prefix + "implausible": bool(p["implausible"]),
            prefix + "implausible_reasons": "; ".join(p["reasons"])}


def flagged(r, prefix):
    """True when summary row ``r`` flags the timing at ``prefix`` (``b1_``, ``e2e_b32_``...)."""
    v = r.get(prefix + "implausible")
    return isinstance(v, (bool, np.bool_)) and bool(v)


def implausible_lines(summary):
    """report.md lines naming every flagged timing (variant, region, B, reasons); [] when none.
    ``summary`` is summary.csv's table."""
    out = []
    for _, r in summary.iterrows():
        for region, prefix in (("forward", "b"), ("end to end", "e2e_b")):
            for col in summary.columns:
                if not (col.startswith(prefix) and col.endswith("_implausible")):
                    continue
                head = col[len(prefix):-len("_implausible")]
                if not head.isdigit() or not flagged(r, f"{prefix}{head}_"):
                    continue
                out.append(f"- `{r['variant']}`, {region}, B={head}: "
                           f"{r[f'{prefix}{head}_implausible_reasons']}")
    if not out:
        return []
    return (["====== Implausible timings ======", "",
             "These calls ran faster than their work allows: the encoder's Linear FLOPs (a lower "
             "bound) at the machine's measured peak GEMM rate, or a speed-up more than 3× the "
             "cost model's ideal. Such a speed-up is more likely a measurement bug (cached "
             "logits, an unevaluated graph) than a real one. A speed-up that includes cold calls "
             "(the first of their shape, slower than warm ones) is flagged too, with the median "
             "over its warm rounds. The verdicts do not use speed, but "
             "do not quote these numbers until it is explained (timing.json `plausibility`).",
             ""] + out + [""])


def cpu_text(info):
    """run.json's ``cpu`` (variants/runtime/cpu.py) as one phrase: ``"<model> (<ISA levels>),
    oneDNN <isa>, int8 <scheme>"``; None for a run from before it was recorded."""
    if not info:
        return None
    text = f"{info.get('model') or '?'}"
    if info.get("isa"):
        text += f" ({', '.join(info['isa'])})"
    if info.get("onednn_isa"):
        text += f", oneDNN {info['onednn_isa']}, int8 {info.get('int8_scheme')}"
    return text


def judged_lines(summary):
    """The report line saying which model each verdict belongs to (variants.sweep.timed_check):
    variants judged on the timed model itself; those judged in another mode whose timed build
    was checked equal on every eval row (the largest |Δlogit| and the tolerance recorded); and
    those judged in another mode without that check (folders of an earlier version); and
    those judged from an outputs file (:func:`runs.report_elsewhere.judged_part`)."""
    from runs.report_elsewhere import OUTPUTS_FAMILY, judged_part

    if summary is None or "quality_mode" not in summary or "speed_mode" not in summary:
        return []
    elsewhere = judged_part(summary)
    if "family" in summary:  # outputs files: their own part, not "an earlier version"
        summary = summary[summary["family"] != OUTPUTS_FAMILY]
    same = summary[summary["quality_mode"] == summary["speed_mode"]]
    other = summary[summary["quality_mode"] != summary["speed_mode"]]
    d = pd.to_numeric(other.get("timed_check_max_dlogit", pd.Series(index=other.index,
                                                                    dtype=float)),
                      errors="coerce")
    tol = pd.to_numeric(other.get("timed_check_tolerance", pd.Series(index=other.index,
                                                                     dtype=float)),
                        errors="coerce")
    checked, unchecked = other[d.notna()], other[d.isna()]
    parts = []
    if len(same):
        parts.append(f"{len(same)} judged on the timed ({same['speed_mode'].iloc[0]}) model "
                     "itself")
    if len(checked):
        bound = f" <= {tol.max():.2g}" if tol.notna().any() else ""
        parts.append(f"{len(checked)} judged in {checked['quality_mode'].iloc[0]} mode, their "
                     f"timed ({checked['speed_mode'].iloc[0]}) build checked equal on every "
                     f"eval row (max |Δlogit| {d.max():.2g}{bound})")
    if len(unchecked):
        parts.append(f"{len(unchecked)} judged in {unchecked['quality_mode'].iloc[0]} mode "
                     f"without a check of their timed build ({', '.join(unchecked['variant'])}: "
                     "written by an earlier version; rerun the sweep to check them)")
    if elsewhere:
        parts.append(elsewhere)
    return [f"- judged model = timed model: {'; '.join(parts)}"] if parts else []
