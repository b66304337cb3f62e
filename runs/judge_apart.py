"""The contract's verdict on a subset of the eval rows, reported apart from the variant's own:
for a word table stored by use (issue #42), the eval rows holding a token that no fit text uses
(build.json's ``unseen_eval_ids``: their embeddings are read from the narrower table).

The same judge (:func:`runs.judge.judge_outputs`, passed in) on the eval rows of those ids (the calibration split
whole, as it gives the ε), written as ``<variant>/verdict_unseen.json`` and one section at the end
of ``<variant>/report.md``. It does not change the variant's verdict: it says whether the verdict
also holds on the rows the row map touches.
"""

import numpy as np

FILE = "verdict_unseen.json"


def subset(fields, ids):
    """``fields`` (a mapping of row-wise arrays with ``ids``) restricted to ``ids``, in order."""
    keep = np.isin(np.asarray(fields["ids"]).astype(str), np.asarray(list(ids), str))
    return {k: np.asarray(v)[keep] for k, v in fields.items()}


def judge_apart(judge, ref_cal, ref_eval, var_cal, var_eval, contract, ids, settings,
                outputs):
    """``(n_rows, verdict)`` of the contract on the eval rows of ``ids`` by ``judge``
    (:func:`runs.judge.judge_outputs`; verdict None when no such row); a ValueError of the
    judge (too few rows for a clause's settings) gives ``(n_rows, None)``."""
    ref_sub, var_sub = subset(ref_eval, ids), subset(var_eval, ids)
    n = len(ref_sub["ids"])
    if n == 0:
        return 0, None
    try:
        _, verdict, _ = judge(ref_cal, ref_sub, var_cal, var_sub, contract,
                                      settings=settings, outputs=outputs)
    except ValueError:
        return n, None
    return n, verdict


def section(n_rows, n_total, verdict):
    """The report.md section of :func:`judge_apart`'s result."""
    head = (f"\n## Eval rows holding a token unseen in the fit texts\n\n{n_rows} of {n_total} "
            "eval rows read at least one word-table row stored at the unseen rows' width. ")
    if verdict is None:
        return head + "The contract could not be judged on them alone.\n"
    parts = [f"On them alone the contract's verdict is **{verdict.word}**"]
    if verdict.failed:
        parts.append(f" (failing: {', '.join(verdict.failed)})")
    elif verdict.undecided:
        parts.append(f" (undecided: {', '.join(verdict.undecided)})")
    return head + "".join(parts) + ".\n"
