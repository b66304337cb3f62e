"""The exported folder's model card (``README.md``): what was judged, each clause with its value,
threshold and interval, speed, size, and what was not tested (a multi-label or regression
head's card says what its clauses measure and that the softmax figures and temperatures do not
apply). Markdown from one ``facts`` dict (:func:`variants.export.write.export` builds it), so
another renderer (an HTML report) can take the same facts: pass ``card=`` to ``export``.
"""

import math

from metrics.head_view import DESCRIBED, not_applicable
from variants.export import card_load


def _num(x, spec="{:.4g}"):
    """``spec.format(x)``, or "—" for None / NaN (timing.json and verdict.json allow null)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return spec.format(x)


def _outputs(facts):
    """What the judged model outputs (run.json ``model.outputs``, :func:`metrics.head_view.run_outputs`):
    ``softmax`` (every run before heads were read), ``multi_label`` or ``regression``."""
    from metrics.head_view import run_outputs

    return run_outputs(facts.get("run"))


def markdown(facts):
    """The model card (Markdown) of ``facts``: ``name``, ``family``, ``build``, ``verdict``,
    ``run``, ``model``, ``kind``, ``contract``, ``n_eval``, ``timing``, ``bytes``, ``search``,
    ``quantization``, ``lowrank``, ``reference_fit`` (optional) and those of
    :func:`variants.export.card_load.section` (``architecture``, ``model_type``, ``names``,
    ``kept``, ``decision_head``, ``input_scaled``)."""
    v, b = facts["verdict"], facts["build"]
    status = "PASS" if v.get("passed") else "FAIL"
    lines = [f"# {facts['model']} — {facts['name']} ({facts['family']})", ""]
    if not v.get("passed"):
        lines += [f"> **This variant FAILED its contract** ({', '.join(v.get('failed', []))}) "
                  "and was exported with `--allow-fail`. Do not serve it in place of the "
                  "reference.", ""]
    lines += [f"Verdict against contract `{facts['contract']}`: **{status}**, judged on "
              f"{facts['n_eval']} eval rows"
              + (f" (the winner of the search in `{facts['search']}`)" if facts["search"] else "")
              + ".", ""]
    outputs = _outputs(facts)
    if outputs != "softmax":
        lines += ["Judged on what the head outputs, by the clauses below (computed from the "
                  "saved outputs of reference and variant). " + not_applicable(outputs), ""]
    fit = facts.get("reference_fit")
    if fit and outputs != "softmax":  # the checkpoint's own head, temperature 1 (fixed)
        lines += [f"Judged against the reference with the checkpoint's own head: nothing is "
                  f"fitted for a head that outputs {DESCRIBED.get(outputs, outputs)}; "
                  f"`{fit['file']}` holds temperature 1 only (fixed: a temperature scales a "
                  f"softmax; array sha256 `{fit['sha256']}`, checked by `variants verify`).",
                  ""]
    elif fit:
        how = {"shipped": "shipped with the package for this configuration",
               "cache": "fitted on the run's fit and calibration splits, read from the cache",
               "fitted": "fitted on the run's fit and calibration splits"}.get(fit["source"], "")
        lines += [f"Judged against the reference whose head and temperatures are "
                  f"`{fit['file']}` ({how}; array sha256 `{fit['sha256']}`, checked by "
                  "`variants verify`).", ""]
    lines += card_load.section(facts)
    lines += ["## Size", "",
              f"- `model.safetensors`: {facts['bytes'] / 1e6:.2f} MB (the checkpoint's "
              "tensors, embeddings included"
              + (f"; the decision head is `{facts['decision_head']}`"
                 if facts.get("decision_head") else "")
              + f"); model bytes as judged "
              f"{_num(b.get('model_bytes') and b['model_bytes'] / 1e6, '{:.2f}')} MB",
              f"- stored bits per quantized weight: {_num(b.get('bits_per_weight'))}"]
    q = facts.get("quantization")
    if q:
        over = {k: e for k, e in q.items() if isinstance(e, dict)}
        kept = [k for k, e in q.items() if e is False]
        lines += [f"- quantization: {q['bits']} bits, group size {q['group_size']}; "
                  f"{len(over)} module(s) at another width; {len(kept)} kept full precision"
                  + (f" ({', '.join(kept[:6])}{', …' if len(kept) > 6 else ''})" if kept else "")]
    if facts.get("lowrank"):
        lines += [f"- low rank: {len(facts['lowrank'])} Linears factored into two"]
    if facts.get("w8a8"):
        smooth = sum(bool(e.get("smooth")) for e in facts["w8a8"].values())
        lines += [f"- W8A8: {len(facts['w8a8'])} Linears as int8 codes with per-output-channel "
                  f"scales ({smooth} with SmoothQuant factors); activations quantized per token "
                  "at run time"]
    for path, why in b.get("skipped", []):
        lines += [f"- kept as it is: `{path}` — {why}"]
    lines += ["", "## Contract clauses (eval split)", "",
              "| clause | value | threshold | interval | status |", "|---|---|---|---|---|"]
    for c in v.get("clauses", []):
        ci = (f"[{_num(c.get('ci_low'))}, {_num(c.get('ci_high'))}]"
              if c.get("ci_low") is not None else "—")
        lines.append(f"| {c['id']} | {_num(c.get('value'))} | {c.get('op', '')} "
                     f"{_num(c.get('threshold'))} | {ci} | {c.get('status', '')} |")
    t = facts.get("timing") or {}
    lines += ["", "## Speed (measured against the reference, strict alternation)", ""]
    if t.get("batches"):
        lines += ["| batch | reference p50 ms | variant p50 ms | speed-up [95% CI] |",
                  "|---|---|---|---|"]
        for bs, r in t["batches"].items():
            s = r.get("speedup") or {}  # null: a time too short for the clock
            lines.append(f"| {bs} (L={r.get('seq_len')}) | "
                         f"{_num((r.get('ref') or {}).get('p50_ms'), '{:.1f}')} | "
                         f"{_num((r.get('var') or {}).get('p50_ms'), '{:.1f}')} | "
                         f"{_num(s.get('speedup_median'), '{:.2f}×')} "
                         f"[{_num(s.get('speedup_ci_low'), '{:.2f}')}, "
                         f"{_num(s.get('speedup_ci_high'), '{:.2f}')}] |")
        lines += ["", f"Device {t.get('device')}, timed in `{t.get('mode')}` mode."]
    else:
        lines += ["Not timed."]
    untested = v.get("untested", [])
    lines += ["", "## What was not tested", "",
              f"- clauses with no examples or skipped: {', '.join(untested) or 'none'}",
              "- only the eval rows above (their data fingerprint is in `manifest.json`); other "
              "data, other prompts, longer texts than the tokenizer's max length were not judged",
              "- speed on other machines, batch sizes or sequence lengths than the table's",
              "- the calibration of temperatures on new data (the judged ones are in "
              "`config.json`)" if outputs == "softmax" else
              "- no temperature: the head's logits are judged as they are (T = 1)", ""]
    return "\n".join(lines)
