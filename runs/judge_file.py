"""``variants judge RUN --outputs FILE``: logits made by any runtime (a serving endpoint, Core ML,
ONNX Runtime, a batch job) judged against a sweep's reference as one more variant of the run
(no MLX, no model loaded).

The file (:mod:`runs.outputs_file`) must answer every row of the run's reference, calibration
and eval splits, once each, and nothing else:

- the **eval** rows are judged by the contract, as every variant's are;
- the **calibration** rows give ε, the largest logit drift the margin certificate rests on (and
  the split-conformal ε): a variant's ε is measured on rows apart from the ones it certifies, so
  a file with eval rows only is refused (ε from the eval rows themselves would certify
  in-sample). The temperatures are the reference's (as for every variant of a sweep: they were
  fitted once, on the reference's calibration outputs), so no row is spent on them.

Each row's logits become the run's decision outputs as the sweep makes them
(:func:`runs.outputs.finish_outputs`: the reference's temperature, option mask, scores and
labels of that row; the option -> action map recovered from the reference's saved outputs,
:mod:`runs.action_map`), so a file holding a sweep variant's own logits gets that variant's
verdict, clause for clause. Logits are stored as float32, as the sweep stores its own. A row with
NaN or ±inf among its options is judged as the sweep judges one: the ``finite-outputs`` clause
fails it, naming its id.

The variant lands in ``RUN/<name>/`` (default ``outputs-<file stem>``), family ``outputs``, with
the files a sweep variant has (outputs.npz, calibration_outputs.npz, build.json, timing.json,
family.md, then metrics.json, verdict.json, report.md, report.json from the judge); the run's
summary.csv, report.md, report.html and check.json are rewritten by
:func:`runs.judge.check_run` under the run's lock, so ``variants compare`` and the reports read
it as any variant. Speed: none is measured (no strict alternation with the reference); per-row
``latency_ms`` in the file is summarised in timing.json's ``measured_elsewhere`` (p50, p95,
mean, min, max, n) and shown marked "measured elsewhere"; the speed-up columns stay empty.

Rerunning with the same file (same sha256) rewrites the same files; another file under the
same name is refused unless ``force``; a name the sweep's own variant holds is always refused.
Every refusal happens before anything is written.
"""

import re
from pathlib import Path

import numpy as np

from metrics._checks import short_list, short_path, short_repr
from runs.folder import REFERENCE, CheckError, RunFolder
from runs.outputs_file import SHOWN, OutputsFileError, read_logits_file
from runs.report_elsewhere import OUTPUTS_FAMILY as FAMILY

#: timing.json ``mode`` of a variant judged from a file with latencies (summary.csv's
#: ``speed_mode``; "not measured" without)
SPEED_MODE = "measured elsewhere"
#: build.json ``quality_mode`` of a variant judged from a file
QUALITY_MODE = "outputs file"
#: folder names a variant may not take
RESERVED = (REFERENCE, "plots")


def _named(ids, most=SHOWN):
    return f"{len(ids)} ({short_list(ids, most)})"


def default_name(path):
    """``outputs-<stem>`` of the file (its characters outside ``[A-Za-z0-9._+-]`` made ``_``)."""
    stem = re.sub(r"[^A-Za-z0-9._+-]", "_", Path(path).stem).strip("._") or "file"
    return f"outputs-{stem}"


def check_name(name):
    """Refuse (ValueError) a variant name that cannot be a folder or a summary.csv key."""
    from runs.names import name_problem

    problem = name_problem(name, csv=True)
    if problem is None and name in RESERVED:
        problem = "is a folder every run has"
    if problem:
        raise ValueError(f"--name {short_repr(name)} {problem}; pass another name")


def run_contract(run, contract=None):
    """The contract to judge with: ``contract`` (a path or packaged name) when given, else the
    one the run was judged with (run.json ``contract``: a packaged name, or the file
    ``config.contract`` names), else the packaged one for the run's outputs. Raises
    ContractError, or CheckError when the run's own contract file cannot be found."""
    from contracts.checker import load_contract
    from contracts.contract import PACKAGED
    from contracts.outputs import contract_for
    from metrics.head_view import run_outputs

    if contract is not None:
        return load_contract(contract)
    name = run.meta.get("contract")
    if name is None:
        return load_contract(contract_for(run_outputs(run.meta)))
    if name in PACKAGED:
        return load_contract(name)
    path = run.config.get("contract")
    if path and Path(str(path)).is_file():
        loaded = load_contract(path)
        if loaded.name == name:
            return loaded
    raise CheckError(f"{short_path(run.path)} was judged with contract {short_repr(name)}, whose "
                     f"file ({short_repr(path)}) is not found here; pass it with --contract "
                     "FILE (its other variants are judged again with it)")


def match_rows(run, lf):
    """The file's logits on the reference's rows: {"calibration": (N_c, K), "eval": (N_e, K)}
    float32 arrays (0 past each row's options).

    Raises
    ------
    OutputsFileError
        One line naming every kind of mismatch found (first ids of each and their count):
        duplicated ids, the run's rows the file lacks (per split), ids the run has not, rows
        whose logit count is neither the row's options nor the run's width K, a null (Parquet
        padding) among a row's options.
    """
    refs = {s: run.outputs(REFERENCE, s) for s in ("calibration", "eval")}
    where = {}
    for split, ref in refs.items():
        for i, rid in enumerate(ref["ids"].astype(str).tolist()):
            where.setdefault(rid, []).append((split, i))
    seen, dups, extra = {}, [], []
    for row, rid in enumerate(lf.ids):
        if rid in seen:
            if seen[rid] is not None:
                dups.append(rid)
                seen[rid] = None  # named once
            continue
        seen[rid] = row
        if rid not in where:
            extra.append(rid)
    problems = []
    if dups:
        problems.append(f"{_named(dups)} ids appear more than once")
    for split, ref in refs.items():
        ids = ref["ids"].astype(str).tolist()
        missing = [rid for rid in ids if rid not in seen]
        if missing:
            problems.append(f"{_named(missing)} of the run's {len(ids)} {split} rows are missing"
                            + (" (the calibration rows give ε, the drift the certificate rests "
                               "on)" if split == "calibration" else ""))
    if extra:
        problems.append(f"{_named(extra)} ids are not rows of the run")
    if problems:
        raise OutputsFileError(
            f"outputs file {short_path(lf.path)} does not answer the rows of "
            f"{short_path(run.path)}: " + "; ".join(problems) + "; write one row per id of the "
            "run's calibration and eval splits (reference/calibration_outputs.npz and "
            "reference/outputs.npz hold them), each once")
    out, wrong, padded = {}, [], []
    for split, ref in refs.items():
        mask = ref["option_mask"]
        width = mask.shape[1]
        logits = np.zeros(mask.shape, np.float32)
        for i, rid in enumerate(ref["ids"].astype(str).tolist()):
            row = seen[rid]
            values = lf.logits[row]
            k = int(mask[i].sum())
            if values.size not in (k, width):
                wrong.append(f"{rid} ({values.size}, not {k})")
                continue
            opts = np.flatnonzero(mask[i])
            if values.size == width:  # the run's width: entries past the options are ignored
                if lf.padding is not None and lf.padding[row][opts].any():
                    padded.append(rid)
                    continue
                values = values[opts]
            with np.errstate(over="ignore"):  # beyond float32: inf, judged as the sweep would
                logits[i, opts] = values.astype(np.float32)
        out[split] = logits
    if wrong:
        raise OutputsFileError(
            f"outputs file {short_path(lf.path)}: {_named(wrong, 3)} rows have a logit count "
            f"that is neither the row's options nor the run's width K = {width}; write one "
            "logit per option, in the reference's option order")
    if padded:
        raise OutputsFileError(
            f"outputs file {short_path(lf.path)}: {_named(padded)} rows have a null logit "
            "among their options; write a number for every option (null only past a row's "
            "options)")
    return out


def outputs_from_logits(ref, logits, action_map):
    """The run's :class:`runs.outputs.DecisionOutputs` of ``logits`` (N, K) on the rows of the
    reference's outputs ``ref`` (their temperature, mask, scores, labels and raters), with the
    option -> action map ``action_map`` (N, K, A)."""
    from runs.outputs import finish_outputs

    mask = ref["option_mask"]
    return finish_outputs(logits, mask, ref["temperature"], ref["option_scores"],
                          np.where(mask[:, :, None], action_map, 0.0), ids=ref["ids"],
                          task=ref["task"], labels=ref["labels"], human_dist=ref["human_dist"])


def split_outputs(run, lf):
    """{"calibration", "eval": DecisionOutputs} of the file on the run's rows
    (:func:`match_rows`, :func:`outputs_from_logits`). Raises OutputsFileError, or CheckError
    when the reference's option -> action map cannot be recovered."""
    from runs.action_map import recover_action_map

    logits = match_rows(run, lf)
    refs = {s: run.outputs(REFERENCE, s) for s in ("calibration", "eval")}
    both = {f: np.concatenate([refs["calibration"][f], refs["eval"][f]])
            for f in ("ids", "task", "probs", "action_probs", "option_mask")}
    try:
        amap = recover_action_map(both)
    except ValueError as e:
        raise CheckError(f"{short_path(run.path)}: {e}") from None
    n_cal = len(refs["calibration"]["ids"])
    maps = {"calibration": amap[:n_cal], "eval": amap[n_cal:]}
    return {s: outputs_from_logits(refs[s], logits[s], maps[s]) for s in refs}


def latency_summary(lf):
    """timing.json's ``measured_elsewhere`` block: the file's per-row ``latency_ms`` summarised
    (p50, p95, mean, min, max in ms; ``n`` rows timed of ``rows``); None without latencies."""
    if lf.latency_ms is None:
        return None
    x = lf.latency_ms[~np.isnan(lf.latency_ms)]
    return {"source": "per-row latency_ms of the outputs file", "unit": "ms",
            "p50_ms": float(np.percentile(x, 50)), "p95_ms": float(np.percentile(x, 95)),
            "mean_ms": float(x.mean()), "min_ms": float(x.min()), "max_ms": float(x.max()),
            "n": int(x.size), "rows": len(lf)}


def describe(build, timing):
    """The variant's block in the run's report.md (Markdown)."""
    src = build["source"]
    lines = [f"Outputs judged from the file `{src['file']}` ({src['format']}, {src['rows']} rows, "
             f"sha256 {src['sha256'][:12]}…), made by a runtime outside this suite; the "
             "reference, temperatures and option -> action map are the run's."]
    lat = timing.get("measured_elsewhere")
    if lat:
        lines.append(f"Latency **measured elsewhere** (the file's per-row `latency_ms`, "
                     f"{lat['n']} of {lat['rows']} rows): p50 {lat['p50_ms']:.2f} ms, p95 "
                     f"{lat['p95_ms']:.2f} ms, mean {lat['mean_ms']:.2f} ms; not timed in "
                     "alternation with the reference here, so no speed-up is given.")
    else:
        lines.append("No latency in the file: speed columns are empty (not measured here).")
    return " ".join(lines)


def _existing(run, name, sha, force):
    """Refuse (ValueError) to write ``name`` where a sweep's variant is, or another file's
    outputs are without ``force``. Returns True when the folder already holds this file."""
    from runs.readers import read_build

    vdir = run.path / name
    if not vdir.exists():
        return False
    build = read_build(vdir / "build.json") if (vdir / "build.json").is_file() else None
    if not vdir.is_dir() or build is None or build.get("family") != FAMILY:
        what = (f"a variant of family {build.get('family')}" if build else
                "a folder that is not a judged outputs file")
        raise ValueError(f"{short_path(vdir)} is {what}; pass another --name")
    old = (build.get("source") or {}).get("sha256")
    if old == sha:
        return True
    if not force:
        raise ValueError(f"{short_path(vdir)} holds the judged outputs of another file "
                         f"({short_repr((build.get('source') or {}).get('file'))}, sha256 "
                         f"{str(old)[:12]}…); pass --force to replace them, or another --name")
    return False


def prepare(run_dir, path, *, name=None, contract=None, force=False):
    """Read and check everything :func:`write` needs, writing nothing.

    Returns
    -------
    dict
        ``run`` (RunFolder), ``name``, ``contract``, ``file`` (LogitsFile), ``sha256``,
        ``outputs`` ({split: DecisionOutputs}), ``verdict`` and ``evaluation`` (the judge's, in
        memory), ``same`` (the folder already holds this file).

    Raises
    ------
    OutputsFileError, CheckError, ValueError, ContractError, CorruptFileError
        Each one line naming the problem and the fix (``variants`` exits 2).
    """
    from contracts.outputs import check_outputs
    from metrics.head_view import run_outputs
    from runs.io import file_sha256
    from runs.judge import judge_outputs, variant_files
    from runs.npz_readers import OUTPUT_FIELDS
    from runs.settings import check_calibration_size, check_strata, resolve_settings

    run = RunFolder(run_dir)
    if not run.path.is_dir():
        raise CheckError(f"{short_path(run.path)} is not a folder; pass a run folder written by "
                         "`variants sweep`")
    if not (run.path / REFERENCE / "outputs.npz").is_file():
        raise CheckError(f"{short_path(run.path)} has no reference/outputs.npz; pass a folder "
                         "written by `variants sweep`")
    name = default_name(path) if name is None else name
    check_name(name)
    lf = read_logits_file(path)
    sha = file_sha256(path)
    same = _existing(run, name, sha, force)
    con = run_contract(run, contract)
    outputs = run_outputs(run.meta)
    check_outputs(con, outputs, where=f"the model of {short_path(run.path)} (run.json)")
    for other in run.variants():  # every file the run's check reads, before anything is written
        if other != name:
            variant_files(run, other)
    st = resolve_settings(con, run.meta)
    refs = {s: run.outputs(REFERENCE, s) for s in ("calibration", "eval")}
    check_calibration_size(len(refs["calibration"]["ids"]), st["alpha"])
    check_strata(con, refs["eval"])
    outs = split_outputs(run, lf)
    var = {s: {k: getattr(o, k) for k in OUTPUT_FIELDS} for s, o in outs.items()}
    try:
        ev, verdict, _ = judge_outputs(refs["calibration"], refs["eval"], var["calibration"],
                                       var["eval"], con, settings=st, outputs=outputs)
    except ValueError as e:
        raise CheckError(f"{short_path(run.path)}: {e}") from None
    return {"run": run, "name": name, "contract": con, "file": lf, "sha256": sha,
            "outputs": outs, "verdict": verdict, "evaluation": ev, "same": same}


def write(prepared, log=None):
    """Write the variant folder and judge the run (:func:`runs.judge.check_run`, which rewrites
    every variant's verdict and the run's summary.csv, report.md, report.html and check.json).
    Call it holding the run's lock. Returns check_run's {variant: Verdict}."""
    from runs.io import write_json, write_text
    from runs.folder import FAMILY_TEXT
    from runs.judge import check_run

    import shutil

    run, name, lf = prepared["run"], prepared["name"], prepared["file"]
    vdir = run.path / name
    # written into a hidden sibling, then renamed into place: a judge killed midway leaves no
    # half-written variant folder (RunFolder.variants skips dot folders; the next judge of this
    # name, holding the lock as we do, removes the leftovers)
    tmp, old = run.path / f".{name}.judging", run.path / f".{name}.replaced"
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    for split, file in (("calibration", "calibration_outputs.npz"), ("eval", "outputs.npz")):
        prepared["outputs"][split].save(tmp / file)
    lat = latency_summary(lf)
    build = {"family": FAMILY, "config": {"outputs_file": lf.path.name},
             "quality_mode": QUALITY_MODE, "bits_per_weight": None, "model_bytes": None,
             "bits_per_weight_note": "not known (outputs of another runtime)",
             "source": {"file": lf.path.name, "path": str(lf.path.resolve()),
                        "format": lf.format, "sha256": prepared["sha256"], "rows": len(lf)}}
    timing = {"mode": SPEED_MODE if lat else "not measured",
              "timed_region": ("as the runtime that wrote the file timed it (per row; not in "
                               "alternation with the reference)" if lat else "none"),
              "batches": {}, "measured_elsewhere": lat}
    write_json(tmp / "build.json", build)
    write_json(tmp / "timing.json", timing)
    write_text(tmp / FAMILY_TEXT, describe(build, timing) + "\n")
    if vdir.exists():  # the same file judged again, or another one with force
        vdir.rename(old)
    tmp.rename(vdir)
    shutil.rmtree(old, ignore_errors=True)
    return check_run(run.path, contract=prepared["contract"], log=log)


def judge_file(run_dir, path, *, name=None, contract=None, force=False, log=None):
    """:func:`prepare` then :func:`write`, both holding the run's lock (:mod:`runs.lock`: a
    sweep or check writing the run refuses us, and we it). Returns ``(name, verdicts)``: the
    variant's folder name and every variant's Verdict."""
    from runs import lock as runlock

    if not Path(run_dir).is_dir():
        raise CheckError(f"{short_path(run_dir)} is not a folder; pass a run folder written by "
                         "`variants sweep`")
    with runlock.hold(run_dir, log=log or (lambda m: None),
                      fix="wait for it to finish, then rerun"):
        prepared = prepare(run_dir, path, name=name, contract=contract, force=force)
        return prepared["name"], write(prepared, log=log)
