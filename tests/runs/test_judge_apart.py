"""The verdict on the eval rows a word table stored by use touches, reported apart
(runs.judge_apart, issue #42): the same judge on those rows, written beside the variant's own."""

import json
import shutil
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sweep_small"


def _with_ids(tmp_path, name, pick):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    ids = [str(i) for i in np.load(run / name / "outputs.npz")["ids"]]
    build = run / name / "build.json"
    info = json.loads(build.read_text())
    info["unseen_eval_ids"] = pick(ids)
    build.write_text(json.dumps(info))
    return run, info["unseen_eval_ids"]


def test_every_row_apart_is_the_variants_own_verdict(tmp_path):
    from runs.judge import check_run

    run, ids = _with_ids(tmp_path, "q4-g64", lambda ids: ids)
    verdicts = check_run(run, variants=["q4-g64"])
    apart = json.loads((run / "q4-g64" / "verdict_unseen.json").read_text())
    assert apart["rows"] == apart["ids"] == len(ids)
    assert apart["verdict"]["failed"] == verdicts["q4-g64"].failed
    assert apart["verdict"]["outcome"] == verdicts["q4-g64"].outcome
    text = (run / "q4-g64" / "report.md").read_text()
    assert text.rstrip().endswith(".") and "## Eval rows holding a token unseen" in text
    assert f"{len(ids)} of {len(ids)} eval rows" in text


def test_a_subset_is_judged_on_its_rows_alone(tmp_path):
    from runs import judge_apart
    from runs.folder import RunFolder
    from runs.judge import OUTPUT_FIELDS, check_run, judge_outputs, resolve_settings
    from contracts.checker import load_contract

    run, ids = _with_ids(tmp_path, "q8-g64", lambda ids: ids[::3])
    check_run(run, variants=["q8-g64"])
    apart = json.loads((run / "q8-g64" / "verdict_unseen.json").read_text())
    # independently: the eval arrays cut to those ids by hand, the same judge
    folder = RunFolder(run)
    f = {n: {s: {k: folder.outputs(n, s)[k] for k in OUTPUT_FIELDS}
             for s in ("calibration", "eval")} for n in ("reference", "q8-g64")}
    keep = np.isin(f["reference"]["eval"]["ids"].astype(str), ids)
    cut = {n: {k: v[keep] for k, v in f[n]["eval"].items()} for n in f}
    contract = load_contract(None)
    _, want, _ = judge_outputs(f["reference"]["calibration"], cut["reference"],
                               f["q8-g64"]["calibration"], cut["q8-g64"], contract,
                               settings=resolve_settings(contract, folder.meta))
    assert apart["rows"] == int(keep.sum()) == len(ids) > 0
    assert apart["verdict"]["failed"] == want.failed
    assert apart["verdict"]["outcome"] == want.outcome
    got = {c["id"]: (c["value"], c["n"]) for c in apart["verdict"]["clauses"]}
    assert got == {c["id"]: (c["value"], c["n"]) for c in want.to_dict()["clauses"]}
    # the eval clauses count those rows alone (calibration-split clauses keep the split whole)
    assert got["agreement"][1] == len(ids)
    assert judge_apart.subset(cut["reference"], [])["ids"].size == 0
    # a variant without the ids writes no such file
    assert not (run / "q2-g64" / judge_apart.FILE).exists()
