"""DecisionOutputs: everything a decision model exposes, the subject of every contract."""

from dataclasses import dataclass, fields

import numpy as np

from metrics.drift import entropy_confidence
from metrics.finite import nonfinite_rows
from metrics.softmax import masked_softmax

from runs.io import write_npz
from runs.npz_readers import read_outputs

#: Per-example arrays a DecisionOutputs may carry besides its dataclass fields.
OPTIONAL_FIELDS = ("exit_layer",)


@dataclass
class DecisionOutputs:
    """Outputs of a decision model on N examples with up to K options and A actions.

    Attributes
    ----------
    ids : ndarray of shape (N,), str
        Example ids (stable across runs).
    task : ndarray of shape (N,), str
        Task name of each example (e.g. ``"sentiment-3"``).
    logits : ndarray of shape (N, K), float32
        Raw option logits before temperature; 0 where ``option_mask`` is False.
    option_mask : ndarray of shape (N, K), bool
        True for the example's valid options; row i has ``n_options[i]`` True entries first.
    temperature : ndarray of shape (N,), float32
        Temperature of the example's option-count bucket (> 0).
    probs : ndarray of shape (N, K), float32
        softmax(logits / T) over valid options, 0 elsewhere.
    option_scores : ndarray of shape (N, K), float32
        Score of each option; NaN where the task has no scores.
    expected_score : ndarray of shape (N,), float32
        sum_k p_k s_k; NaN where the task has no scores.
    confidence : ndarray of shape (N,), float32
        Entropy confidence 1 - H(p) / log K_i, in [0, 1].
    action_probs : ndarray of shape (N, A), float32
        Probabilities aggregated through the task's option -> action map.
    labels : ndarray of shape (N,), int64
        Gold option index, -1 where unknown.
    human_dist : ndarray of shape (N, K), float32
        Share of raters choosing each option; NaN where no raters.
    exit_layer : ndarray of shape (N,), int64, or None
        Optional (see ``OPTIONAL_FIELDS``). Early exit only: encoder layers run per example
        (N_layers = no early exit); None for other models. Not a dataclass field, so code that
        iterates the fields sees the required arrays only; :meth:`subset`, :meth:`save` and
        :meth:`load` carry it, and files without it load with None.
    """

    ids: np.ndarray
    task: np.ndarray
    logits: np.ndarray
    option_mask: np.ndarray
    temperature: np.ndarray
    probs: np.ndarray
    option_scores: np.ndarray
    expected_score: np.ndarray
    confidence: np.ndarray
    action_probs: np.ndarray
    labels: np.ndarray
    human_dist: np.ndarray
    exit_layer = None  # optional, not a field (no annotation): set by finish_outputs / load

    @property
    def n_options(self):
        """(N,) int: number of valid options per example."""
        return self.option_mask.sum(axis=1)

    def __len__(self):
        return len(self.ids)

    def subset(self, index):
        """Rows ``index`` (bool mask or int array) of every field, as a new DecisionOutputs."""
        out = DecisionOutputs(**{f.name: getattr(self, f.name)[index] for f in fields(self)})
        for name in OPTIONAL_FIELDS:
            if getattr(self, name) is not None:
                setattr(out, name, getattr(self, name)[index])
        return out

    def save(self, path):
        """Write all fields to ``path`` (.npz) atomically (optional ones only when set), and
        ``nonfinite_rows`` (N,) bool when a row has NaN or inf outputs
        (:func:`metrics.finite.nonfinite_rows`: the rows the ``finite-outputs`` clause
        fails; the reader accepts non-finite values on those rows only)."""
        arrays = {f.name: getattr(self, f.name) for f in fields(self)}
        arrays.update({n: getattr(self, n) for n in OPTIONAL_FIELDS if getattr(self, n) is not None})
        bad = nonfinite_rows(self)
        if bad.any():
            arrays["nonfinite_rows"] = bad
        return write_npz(path, arrays)

    @classmethod
    def load(cls, path, kind="outputs file"):
        """Read a DecisionOutputs written by :meth:`save` (optional fields absent -> None).

        Raises ``runs.readers.CorruptFileError`` (a ValueError naming the file, ``kind``
        in its message) when the file is not such an npz (:func:`runs.npz_readers.read_outputs`).
        """
        z = read_outputs(path, kind)
        out = cls(**{f.name: z[f.name] for f in fields(cls)})
        for name in OPTIONAL_FIELDS:
            if name in z:
                setattr(out, name, z[name])
        return out


def finish_outputs(logits, option_mask, temperature, option_scores, action_map, *, ids, task,
                   labels, human_dist, exit_layer=None):
    """Derive probabilities, expected score, confidence and action probabilities from logits.

    Parameters
    ----------
    logits : array-like of shape (N, K), float
        Raw logits; entries outside ``option_mask`` are ignored.
    option_mask : array-like of shape (N, K), bool
    temperature : array-like of shape (N,), float, > 0
    option_scores : array-like of shape (N, K), float (NaN where no scores)
    action_map : array-like of shape (N, K, A), float
        1 where option k of example i maps to action a; rows of invalid options are zero.
    ids, task, labels, human_dist : see :class:`DecisionOutputs`.
    exit_layer : array-like of shape (N,), int, optional
        Early exit: layers run per example (see :class:`DecisionOutputs`).

    Returns
    -------
    DecisionOutputs

    Raises
    ------
    ValueError
        If shapes disagree, a temperature is not positive, or a row has no valid option.
    """
    logits = np.asarray(logits, dtype=np.float64)
    mask = np.asarray(option_mask, dtype=bool)
    temperature = np.asarray(temperature, dtype=np.float64)
    if logits.shape != mask.shape or logits.ndim != 2:
        raise ValueError(f"logits {logits.shape} and option_mask {mask.shape} must be equal (N, K)")
    if temperature.shape != (logits.shape[0],):
        raise ValueError(f"temperature must have shape ({logits.shape[0]},), got {temperature.shape}")
    if not np.all(temperature > 0):
        raise ValueError("temperature must be > 0 for every example")
    if not np.all(mask.any(axis=1)):
        raise ValueError("every example needs at least one valid option in option_mask")
    if exit_layer is not None:
        exit_layer = np.asarray(exit_layer, dtype=np.int64)
        if exit_layer.shape != (logits.shape[0],):
            raise ValueError(f"exit_layer must have shape ({logits.shape[0]},), got "
                             f"{exit_layer.shape}")
    probs = masked_softmax(logits, mask, temperature)
    scores = np.asarray(option_scores, dtype=np.float64)
    expected = np.where(np.isnan(scores).all(axis=1), np.nan, np.nansum(probs * scores, axis=1))
    confidence = entropy_confidence(probs, mask)
    actions = np.einsum("nk,nka->na", probs, np.asarray(action_map, dtype=np.float64))
    f32 = np.float32
    out = DecisionOutputs(
        ids=np.asarray(ids).astype(str),
        task=np.asarray(task).astype(str),
        logits=np.where(mask, logits, 0.0).astype(f32),
        option_mask=mask,
        temperature=temperature.astype(f32),
        probs=probs.astype(f32),
        option_scores=scores.astype(f32),
        expected_score=expected.astype(f32),
        confidence=np.clip(confidence, 0.0, 1.0).astype(f32),
        action_probs=actions.astype(f32),
        labels=np.asarray(labels, dtype=np.int64),
        human_dist=np.asarray(human_dist, dtype=f32),
    )
    out.exit_layer = exit_layer
    return out
