"""The judge: metrics, verdict and reports of each variant from a run folder's saved outputs.

:func:`judge_outputs` is pure (arrays in, evaluation and verdict out); :func:`judge_variant`
reads one variant of a :class:`runs.folder.RunFolder` and writes its metrics.json, verdict.json,
report.md and report.json; :func:`check_run` (``variants check``) judges every variant and
rewrites the run's summary.csv, report.md and check.json. The sweep judges through
:func:`judge_variant` too, so ``variants sweep`` and ``variants check`` write identical files.
No model is loaded and no builder imported: what a family says about a variant is read from
``<variant>/family.md`` (:mod:`runs.family_text`).
"""

from dataclasses import replace
from pathlib import Path

import numpy as np

from metrics.head_view import run_outputs  # noqa: F401  (re-exported)
from metrics._checks import short_list, short_path, short_repr
from runs.family_text import family_extras  # noqa: F401  (re-exported: the sweep's name)
from runs.folder import REFERENCE, CheckError, RunFolder
from runs.npz_readers import OUTPUT_FIELDS, check_same_ids, read_outputs
from runs.readers import CorruptFileError
from runs.settings import (DEFAULT_NEAR_TIE_MARGIN, check_calibration_size,  # noqa: F401
                           check_strata, resolve_settings)
from runs.texts import example_texts


def _folder(run_dir):
    return run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)


def load_outputs(path):
    """Saved outputs (.npz) as a dict of the ``DecisionOutputs`` fields (``exit_layer`` dropped).

    Raises
    ------
    CheckError
        If the file is missing.
    runs.readers.CorruptFileError
        If it is not an npz of outputs (:func:`runs.npz_readers.read_outputs`).
    """
    path = Path(path)
    if not path.exists():
        raise RunFolder(path.parent.parent).missing(path)
    return _fields(read_outputs(path))


def _fields(out):
    return {k: out[k] for k in OUTPUT_FIELDS}


def list_variants(run_dir):
    """Names of the variant folders of a run (those holding both outputs files), sorted
    (:meth:`runs.folder.RunFolder.variants`)."""
    return _folder(run_dir).variants()


def read_run(run_dir):
    """run.json as a dict ({} when absent); CorruptFileError when it is not a valid run file."""
    return _folder(run_dir).meta


def variant_files(run_dir, name):
    """Read and validate what judging variant ``name`` reads (outputs of the reference and of the
    variant, build.json and timing.json where present), before anything is written.

    Raises CheckError (a file missing) or CorruptFileError (a file unreadable or wrong-shaped).
    """
    run = _folder(run_dir)
    for split, file in (("calibration", "calibration_outputs.npz"), ("eval", "outputs.npz")):
        ref = run.outputs(REFERENCE, split)
        check_same_ids(run.path / name / file, run.outputs(name, split)["ids"], ref["ids"])
    build = run.json(name, "build.json")
    run.json(name, "timing.json")
    if (run.path / name / "build.json").is_file() and (run.path / name / "timing.json").is_file():
        require_family(run.path / name / "build.json", build)


def require_family(path, build):
    """Raise CorruptFileError unless ``build`` (build.json at ``path``, as read) names its family:
    summary.csv's family column comes from it, and a row without one is corrupt."""
    if not (isinstance(build.get("family"), str) and build["family"].strip()):
        raise CorruptFileError(path, "build file", f"family is {short_repr(build.get('family'))}, "
                               "expected the family's name, e.g. 'quant'")


def _json_safe(summary):
    """NaN → None (null), so metrics.json is strict JSON and two writes compare equal."""
    def clean(v):
        if isinstance(v, float) and v != v:
            return None
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return {k: clean(v) for k, v in summary.items()}


def judge_outputs(ref_cal, ref_eval, var_cal, var_eval, contract, *, settings=None,
                  outputs="softmax"):
    """Metrics and verdict of one variant from its and the reference's outputs (pure, no files).

    Parameters
    ----------
    ref_cal, ref_eval, var_cal, var_eval : mapping of arrays
        ``DecisionOutputs`` fields on the calibration and eval splits.
    contract : contracts.checker.Contract
    settings : dict, optional
        As :func:`resolve_settings`; default the contract's (near-tie margin 1.0 if unset).
    outputs : str, default "softmax"
        What the model outputs (:func:`run_outputs`). For ``multi_label`` / ``regression`` the
        evaluation's ``summary`` also holds ``outputs`` and that head's figures
        (:func:`metrics.head_summary.head_summary`), which the tables and reports show in place
        of the softmax ones; ``ev.outputs`` is set either way.

    Returns
    -------
    ev : metrics.evaluate.Evaluation
    verdict : contracts.checker.Verdict
    epsilons : dict
        :func:`metrics.conformal.epsilon_by_bucket` on the calibration split, plus ``alpha``.

    A variant's rows with NaN or inf outputs (:func:`metrics.finite.nonfinite_rows`) are judged
    by the ``finite-outputs`` clause (``ev.nonfinite`` lists them by id, ``ev.summary``'s
    ``nonfinite_rows`` counts them); on the calibration split each is an unbounded drift (ε and
    the conformal ε become inf where one falls: nothing is certified), on the eval split they
    are left out of every other metric.

    Raises
    ------
    ValueError
        The reference's own outputs have NaN or inf (named by split and row ids), or the
        settings or outputs are invalid (:func:`metrics.evaluate.evaluate`).
    """
    from contracts.checker import check
    from metrics.conformal import epsilon_by_bucket
    from metrics.evaluate import evaluate
    from metrics.finite import describe_rows, finite_part, nonfinite_rows
    from metrics.defaults import VALUE_TOLERANCE
    from metrics.margin import epsilon_max, max_abs_logit_diff

    st = resolve_settings(contract) if settings is None else settings
    for split, ref in (("calibration", ref_cal), ("eval", ref_eval)):
        bad = nonfinite_rows(ref)
        if bad.any():
            raise ValueError(f"the reference's {split} outputs have NaN or inf on "
                             f"{describe_rows(ref['ids'], bad)}: no variant can be judged against "
                             "them; fix the reference model (its own outputs must be numbers)")
    # a variant's rows with NaN or inf: the finite-outputs clause fails them; on calibration
    # they are unbounded drifts (ε = inf: nothing certified), on eval left out of every metric
    bad_cal = nonfinite_rows(var_cal)
    cal_diff = np.full(bad_cal.size, np.inf)
    ok = ~bad_cal
    if ok.any():
        cal_diff[ok] = max_abs_logit_diff(ref_cal["logits"][ok], var_cal["logits"][ok],
                                          ref_cal["option_mask"][ok])
    check_calibration_size(len(cal_diff), st["alpha"])
    check_strata(contract, ref_eval)
    eps = float("inf") if bad_cal.any() else epsilon_max(cal_diff)
    epsilons = epsilon_by_bucket(cal_diff, ref_cal["option_mask"].sum(axis=1), alpha=st["alpha"])
    epsilons["alpha"] = st["alpha"]
    var_eval_ids = np.asarray(var_eval["ids"]).astype(str)
    ref_eval, var_eval, bad_eval = finite_part(ref_eval, var_eval)
    ev = evaluate(ref_eval, var_eval, epsilon=eps, near_tie_margin=st["near_tie_margin"],
                  n_bins=st["n_bins"], epsilon_conformal=epsilons["all"]["epsilon_conformal"],
                  alpha=st["alpha"], human_tie_gap=st["human_tie_gap"],
                  numerical_noise=st.get("numerical_noise", 0.0),
                  value_tolerance=st.get("value_tolerance", VALUE_TOLERANCE))
    ev.nonfinite = {"eval": var_eval_ids[bad_eval].tolist(),
                    "calibration": np.asarray(var_cal["ids"]).astype(str)[bad_cal].tolist(),
                    "rows": int(bad_eval.size + bad_cal.size)}
    ev.summary.update(nonfinite_rows=ev.n_nonfinite, nonfinite_eval_ids=ev.nonfinite["eval"],
                      nonfinite_calibration_ids=ev.nonfinite["calibration"])
    ev.outputs = outputs
    if outputs != "softmax":  # a softmax run's summary (and files) unchanged
        from metrics.head_summary import blank_softmax, head_summary

        ev.summary.update(outputs=outputs, **head_summary(
            ev, outputs, st.get("value_tolerance", VALUE_TOLERANCE)))
        ev.summary = blank_softmax(ev.summary)  # softmax figures: NaN, listed not_applicable
    verdict = check(contract, ev, n_bootstrap=st["n_bootstrap"], confidence=st["confidence"],
                    seed=st["seed"])
    verdict = replace(verdict, settings={**verdict.settings, **st})  # record what was in force
    return ev, verdict, epsilons


def judge_variant(run_dir, name, contract, *, near_tie_margin=None, alpha=None, n_bootstrap=None,
                  seed=None, output_dir=None, texts=None, worst_n=5, write=True, outputs=None):
    """Recompute metrics, verdict and reports of variant ``name`` of a run from saved outputs.

    This is the sweep's judging step (``Sweep.judge`` calls it), so ``variants sweep`` and
    ``variants check`` write identical files.

    Parameters
    ----------
    run_dir : path-like or runs.folder.RunFolder
        ``results/<run>`` with ``reference/`` and ``<name>/`` (outputs.npz,
        calibration_outputs.npz; build.json and timing.json are used when present). Pass a
        RunFolder to share its reads between variants.
    name : str
        Variant folder name.
    contract : contracts.checker.Contract
    near_tie_margin, alpha, n_bootstrap, seed : optional
        Override the contract's ``[settings]`` (near_tie_margin falls back to run.json).
    output_dir : path-like, optional
        Where ``<name>/metrics.json``, ``verdict.json``, ``report.md`` and ``report.json`` go;
        default ``run_dir`` (in place).
    texts : mapping of id -> str, optional
        Example texts for the worst-examples listing; default looked up in the VADER data.
    worst_n : int, default=5
    write : bool, default=True
    outputs : str, optional
        What the model outputs (``softmax``, ``multi_label``, ``regression``); default
        :func:`run_outputs` of run.json (the sweep passes its model's: run.json has no model
        block while it judges).

    Returns
    -------
    row : dict or None
        :func:`runs.report.summary_row` (None when build.json or timing.json is missing).
    ev : metrics.evaluate.Evaluation
    verdict : contracts.checker.Verdict

    Raises
    ------
    CheckError
        If an outputs file is missing or reference and variant outputs do not describe the same
        examples.
    runs.readers.CorruptFileError
        If a file read is not valid.
    """
    from contracts.report import render_variant_report, variant_report_json
    from runs.io import write_json, write_text
    from runs.report import summary_row

    run = _folder(run_dir)
    out_dir = Path(output_dir) if output_dir is not None else run.path
    vdir = run.path / name
    ref_cal, ref_eval = (_fields(run.outputs(REFERENCE, s)) for s in ("calibration", "eval"))
    var_cal, var_eval = (_fields(run.outputs(name, s)) for s in ("calibration", "eval"))
    st = resolve_settings(contract, run.meta, near_tie_margin=near_tie_margin, alpha=alpha,
                          n_bootstrap=n_bootstrap, seed=seed)
    try:
        ev, verdict, epsilons = judge_outputs(
            ref_cal, ref_eval, var_cal, var_eval, contract, settings=st,
            outputs=run_outputs(run.meta) if outputs is None else outputs)
    except ValueError as e:
        raise CheckError(f"{vdir}: {e}") from None
    row = None
    if run.has(name, "build.json") and run.has(name, "timing.json"):
        row = summary_row(name, run.json(name, "build.json"), ev.summary, verdict,
                          run.json(name, "timing.json"))
    if write:
        if texts is None:
            texts = example_texts(ev.per_example["id"])
        odir = out_dir / name
        ids = run.json(name, "build.json").get("unseen_eval_ids") \
            if run.has(name, "build.json") else None
        apart = ""
        if ids:  # a table stored by use: its unseen rows' eval rows judged apart
            from runs import judge_apart

            n, sub = judge_apart.judge_apart(
                judge_outputs, ref_cal, ref_eval, var_cal, var_eval, contract, ids, st,
                run_outputs(run.meta) if outputs is None else outputs)
            apart = judge_apart.section(n, len(ref_eval["ids"]), sub)
        write_json(odir / "metrics.json", _json_safe(ev.summary))
        write_json(odir / "verdict.json", verdict.to_dict())
        write_text(odir / "report.md", render_variant_report(name, ev, verdict, contract, epsilons,
                                                             texts=texts, worst_n=worst_n)
                   + apart)
        write_json(odir / "report.json", variant_report_json(name, ev, verdict, contract, epsilons,
                                                             texts=texts, worst_n=worst_n))
        if ids:
            write_json(odir / judge_apart.FILE, {"rows": n, "ids": len(ids),
                                                 "verdict": sub and sub.to_dict()})
    return row, ev, verdict


def check_run(run_dir, *, contract=None, variants=None, output_dir=None, log=None, **kwargs):
    """``variants check``: judge every (or the named) variant of a run; rewrite the sweep files.

    Writes per variant what :func:`judge_variant` writes, and per run ``summary.csv`` and
    ``report.md`` (when every variant has build.json and timing.json and run.json exists) and
    ``check.json`` (verdict per variant, schema ``REPORT_SCHEMA_VERSION``). The report's plot
    section reuses the evaluations just made (no second read or evaluation). Checking in place
    (no ``output_dir``), run.json says ``"checking"`` while files are rewritten and gets its
    status back after the last one; a check that stops midway (a write error, a kill) leaves
    ``"checking"`` or ``"incomplete"`` (with ``check_error``; ``status_before_check`` keeps the
    status to restore), never a "complete" folder of mixed files; a check that then finishes
    restores it.

    ``contract`` None judges with the packaged contract of the run's outputs (:func:`run_outputs`:
    ``default`` for a softmax, ``multi_label``, ``regression``).

    Returns
    -------
    verdicts : dict of str -> contracts.checker.Verdict

    Raises
    ------
    CheckError
        A folder that is not a run, an unknown ``variants`` name, a missing file.
    contracts.checker.ContractError
        A contract with a clause that does not measure the run's outputs
        (:func:`contracts.outputs.check_outputs`).
    runs.readers.CorruptFileError
        A file that does not parse; raised before anything is written.
    """
    from contracts.checker import load_contract
    from runs.io import write_json

    run = _folder(run_dir)
    run_dir = run.path
    if not run_dir.is_dir():
        raise CheckError(f"{short_path(run_dir)} is not a folder; pass a run folder such as "
                         "results/minilm-sentiment-quant-g64.")
    if not (run_dir / REFERENCE / "outputs.npz").exists():
        raise CheckError(f"{run_dir} has no reference/outputs.npz; pass a folder written by "
                         "`variants sweep`.")
    from contracts.outputs import check_outputs, contract_for

    outputs = run_outputs(run.meta)
    if contract is None or isinstance(contract, (str, Path)):
        contract = load_contract(contract_for(outputs, contract))
    check_outputs(contract, outputs, where=f"the model of {short_path(run_dir)} (run.json)")
    names = run.variants()
    if variants:
        unknown = sorted(set(variants) - set(names))
        if unknown:
            raise CheckError(f"no variant {short_list(unknown)} in {run_dir}; it has: "
                             f"{', '.join(names) or 'none'}.")
        names = [n for n in names if n in variants]
    if not names:
        raise CheckError(f"{run_dir} holds no variant with outputs.npz and calibration_outputs.npz.")
    out_dir = Path(output_dir) if output_dir is not None else run_dir
    run.meta  # every file judged is read and validated before anything is written
    for name in names:
        variant_files(run, name)
    # and the settings checked against them: a bad --alpha leaves the folder as it was
    st = resolve_settings(contract, run.meta, **{k: kwargs.get(k) for k in (
        "near_tie_margin", "alpha", "n_bootstrap", "seed")})
    check_calibration_size(len(run.outputs(REFERENCE, "calibration")["ids"]), st["alpha"])
    check_strata(contract, run.outputs(REFERENCE, "eval"))
    in_place = out_dir.resolve() == run_dir.resolve() and bool(run.meta)
    if in_place:  # run.json must not say "complete" while its files are being rewritten
        meta = {k: v for k, v in run.meta.items() if k != "check_error"}
        before = meta.pop("status_before_check", meta.get("status"))
        write_json(run_dir / "run.json", dict(meta, status="checking", status_before_check=before))
    try:
        verdicts = _judge_and_write(run, names, contract, out_dir, variants, log, kwargs,
                                    in_place)
    except BaseException as e:
        if in_place:  # the folder now mixes new and old files: say so (best effort)
            try:
                write_json(run_dir / "run.json", dict(
                    meta, status="incomplete", status_before_check=before,
                    check_error={"file": str(getattr(e, "filename", None) or ""),
                                 "error": f"{type(e).__name__}: {e}"}))
            except OSError:
                pass
        raise
    if in_place:
        if before is not None:
            meta = dict(meta, status=before)  # as before the check
        write_json(run_dir / "run.json", meta)
    return verdicts


def _judge_and_write(run, names, contract, out_dir, variants, log, kwargs, in_place):
    """The writing half of :func:`check_run` (every file already read and validated); a
    report.html that cannot be rendered raises :class:`runs.io.RunIncomplete` after report.md
    is written."""
    import pandas as pd

    from contracts.report import REPORT_SCHEMA_VERSION
    from runs.io import write_csv, write_json, write_text
    from runs.html.render import write_beside_markdown
    from runs.plots.markdown import report_tail
    from runs.report import render_report

    run_dir = run.path
    rows, details, verdicts = [], {}, {}
    for name in names:
        row, ev, verdict = judge_variant(run, name, contract, output_dir=out_dir, **kwargs)
        verdicts[name] = verdict
        details[name] = (ev, verdict)
        rows.append(row)
        if log:
            log(f"{name}: {verdict.word}"
                + (f" ({', '.join(verdict.failed + verdict.undecided)})"
                   if verdict.failed or verdict.undecided else "") + verdict.unjudged_text())
    write_json(out_dir / "check.json", {
        "schema_version": REPORT_SCHEMA_VERSION, "run": str(run_dir), "contract": contract.name,
        "passed": all(v.passed for v in verdicts.values()),
        "variants": {n: v.to_dict() for n, v in verdicts.items()}})
    meta = run.meta
    if meta and all(r is not None for r in rows) and not variants:
        summary = pd.DataFrame(rows)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(out_dir / "summary.csv", summary)
        meta = dict(meta, contract=contract.name)
        extras = run.family_texts(names)  # <variant>/family.md, else run.json's extras
        write_text(out_dir / "report.md", render_report(meta, summary, details, contract, extras)
                   + report_tail(run, out_dir))
        write_beside_markdown(run, out_dir=out_dir,
                              evaluations={n: ev for n, (ev, _) in details.items()},
                              said="run.json says incomplete" if in_place else
                              f"check.json, summary.csv and report.md in {out_dir} are written")
    return verdicts
