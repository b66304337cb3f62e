"""Write examples/vader_raters.jsonl: 300 VADER rows in the own-data schema (README "Your data in
brief", docs/user-guide.md "Your own model and data"), deterministic, from the vendored corpus.

Each row: ``id`` (the corpus id), ``text``, ``question``, ``options`` negative/neutral/positive,
``label`` (option text of the mean rating, binned by ``variants.datasets.labels.SENTIMENT_BINS[3]``),
``raters`` (each rater's choice as an option index, the same bins), ``scores`` [-1, 0, 1],
``actions`` (escalate/review/none, as minilm-sentiment), ``task`` "sentiment-3"; every 5th row
also carries an explicit ``split`` (cycling fit/calibration/eval), the rest get the id-hash split.

Run from the repository root: ``python examples/make_example_data.py`` (rewrites the file;
the output is byte-identical on every run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "examples" / "vader_raters.jsonl"
N_ROWS = 300
OPTIONS = ["negative", "neutral", "positive"]
SCORES = [-1.0, 0.0, 1.0]
ACTIONS = ["escalate", "review", "none"]
QUESTION = "What is the sentiment of this text?"
EXPLICIT_SPLITS = ("fit", "calibration", "eval")


def example_rows(n=N_ROWS, seed=0):
    """The example's rows (list of dict), domain-stratified by :func:`variants.datasets.bundled.sample`."""
    from variants.datasets import bundled as data

    frame = data.sample(data.load_vader(), n, seed=seed)
    labels = data.sentiment_label(frame["mean_rating"].to_numpy(), 3)
    rows = []
    for i, (rid, text, label, scores) in enumerate(zip(frame["id"], frame["text"], labels,
                                                        frame["rater_scores"])):
        choices = data.sentiment_label([float(s) for s in scores], 3)
        row = {"id": rid, "text": text, "question": QUESTION, "options": OPTIONS,
               "label": OPTIONS[int(label)], "raters": [int(c) for c in choices],
               "scores": SCORES, "actions": ACTIONS, "task": "sentiment-3"}
        if i % 5 == 0:
            row["split"] = EXPLICIT_SPLITS[(i // 5) % 3]
        rows.append(row)
    return rows


def main(out=OUT):
    rows = example_rows()
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
