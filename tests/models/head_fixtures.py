"""Tiny checkpoints whose own head outputs something other than a softmax: the committed BERT
parity folder (tests/fixtures/hf/bert, 4 layers, hidden 64) with config.json's ``num_labels``
(id2label) and ``problem_type`` edited and the classifier re-initialised to the right shape
(a seeded normal (n_labels, 64) weight, scaled so the logits spread over a few units)."""

import json
import shutil
from pathlib import Path

import mlx.core as mx

BERT = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "bert"


def make_head_folder(dst, n_labels, problem_type=None, *, seed=0, scale=2.0, extra=None):
    """Write a BertForSequenceClassification folder at ``dst`` with a ``n_labels``-logit head.

    Parameters
    ----------
    dst : Path
    n_labels : int
    problem_type : str or None
        config.json's ``problem_type`` (None: the key is absent).
    seed : int
        Seed of the head's weight (mx.random).
    scale : float
        Standard deviation of the head's weight entries (the pooled state is tanh, in [-1, 1]).
    extra : dict, optional
        More config.json keys (e.g. a cross-encoder's ``sentence_transformers`` block).

    Returns
    -------
    Path
        ``dst``.
    """
    dst = Path(dst)
    shutil.copytree(BERT, dst)
    (dst / "reference.npz").unlink()  # the parity outputs of the 3-label head: not these
    cfg = json.loads((dst / "config.json").read_text())
    cfg["id2label"] = {str(i): f"LABEL_{i}" for i in range(n_labels)}
    cfg["label2id"] = {f"LABEL_{i}": i for i in range(n_labels)}
    if problem_type is not None:
        cfg["problem_type"] = problem_type
    cfg.update(extra or {})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    weights = mx.load(str(dst / "model.safetensors"))
    key = mx.random.key(seed)
    weights["classifier.weight"] = mx.random.normal((n_labels, 64), key=key) * scale
    weights["classifier.bias"] = mx.zeros((n_labels,))
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    return dst


def model_toml(path, checkpoint, name="head"):
    """A model TOML at ``path`` judging ``checkpoint`` with its own head (options: id2label)."""
    path = Path(path)
    path.write_text(f'name = "{name}"\nlogits = "classifier"\ncheckpoint = "{checkpoint}"\n',
                    encoding="utf-8")
    return path


def rows_jsonl(path, n=120, splits=None):
    """``n`` unlabelled rows (id, text) in a JSONL file at ``path``; split by id hash, or by
    ``splits`` ({"fit": n1, "calibration": n2, "eval": n3}, in that order, summing to n)."""
    words = ["good", "bad", "fine", "awful", "great", "dull", "movie", "food", "service", "plot",
             "not", "very", "the", "was", "is", "it"]
    names = [s for s, k in (splits or {}).items() for _ in range(k)]
    path = Path(path)
    rows = []
    for i in range(n):
        row = {"id": f"r{i}", "text": " ".join(words[(i * k + i // 7) % len(words)]
                                              for k in range(1, 3 + i % 6))}
        if names:
            row["split"] = names[i]
        rows.append(json.dumps(row) + "\n")
    path.write_text("".join(rows), encoding="utf-8")
    return path
