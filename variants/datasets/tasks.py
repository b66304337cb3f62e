"""TaskSet: prepared questions (text, options, scores, action map, labels, raters) for a model."""

from dataclasses import dataclass, fields

import numpy as np

from runs.io import digest


@dataclass
class TaskSet:
    """N questions with up to K options and A actions.

    Attributes
    ----------
    ids : ndarray (N,) str
    task : ndarray (N,) str
        Task name per question, e.g. ``"sentiment-3"``, ``"domain-4"``.
    texts : ndarray (N,) str
        The text the model reads.
    option_texts : ndarray (N, K) str
        Option wording ("" where the question has fewer options).
    option_mask : ndarray (N, K) bool
    option_scores : ndarray (N, K) float32, NaN where the task has no scores.
    action_map : ndarray (N, K, A) float32
        1 where option k maps to action a.
    action_names : tuple of str, length A
    labels : ndarray (N,) int64, -1 where unknown.
    human_dist : ndarray (N, K) float32, NaN where no raters.
    questions : ndarray (N,) str or None
        Each row's own question for a prompt's ``{question}`` ("" = the model's); None when no
        row has one (then it is left out of :meth:`fingerprint`, which stays as it was).
    """

    ids: np.ndarray
    task: np.ndarray
    texts: np.ndarray
    option_texts: np.ndarray
    option_mask: np.ndarray
    option_scores: np.ndarray
    action_map: np.ndarray
    action_names: tuple
    labels: np.ndarray
    human_dist: np.ndarray
    questions: np.ndarray = None

    def __len__(self):
        return len(self.ids)

    @property
    def n_options(self):
        return self.option_mask.sum(axis=1)

    def subset(self, index):
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        return TaskSet(**{k: (v if k == "action_names" or v is None else v[index])
                          for k, v in kw.items()})

    def fingerprint(self):
        """Stable hash of every array (a cache key part): texts, options, labels, maps."""
        return digest(*[
            (f.name, np.asarray(getattr(self, f.name)).tolist()) for f in fields(self)
            if getattr(self, f.name) is not None
        ])


def build_taskset(rows, *, k_max, action_names):
    """Assemble a TaskSet from a list of per-question dicts.

    Each dict has ``id, task, text, options (list of str), scores (list of float or None),
    actions (list of action names, one per option), label (int), human (list or None)``.
    """
    n, A = len(rows), len(action_names)
    aidx = {a: i for i, a in enumerate(action_names)}
    option_texts = np.full((n, k_max), "", dtype=object)
    mask = np.zeros((n, k_max), bool)
    scores = np.full((n, k_max), np.nan, np.float32)
    amap = np.zeros((n, k_max, A), np.float32)
    human = np.full((n, k_max), np.nan, np.float32)
    for i, r in enumerate(rows):
        k = len(r["options"])
        option_texts[i, :k] = r["options"]
        mask[i, :k] = True
        if r.get("scores") is not None:
            scores[i, :k] = r["scores"]
        for j, a in enumerate(r["actions"]):
            amap[i, j, aidx[a]] = 1.0
        if r.get("human") is not None:
            human[i, :k] = r["human"]
    return TaskSet(
        ids=np.array([r["id"] for r in rows], dtype=str),
        task=np.array([r["task"] for r in rows], dtype=str),
        texts=np.array([r["text"] for r in rows], dtype=str),
        option_texts=option_texts.astype(str),
        option_mask=mask,
        option_scores=scores,
        action_map=amap,
        action_names=tuple(action_names),
        labels=np.array([r["label"] for r in rows], dtype=np.int64),
        human_dist=human,
        questions=(np.array([r.get("question") or "" for r in rows], dtype=str)
                   if any(r.get("question") for r in rows) else None),
    )
