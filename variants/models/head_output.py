"""What a checkpoint's own sequence-classification head outputs, from its ``config.json``: the
kind of number the suite judges (``logits = "classifier"`` models only).

``transformers``' ``*ForSequenceClassification`` reads ``problem_type`` (and, when it is absent,
``num_labels``) to choose its loss, and so what the logits mean:

============================================  ===============  =================================
config.json                                    kind             judged as
============================================  ===============  =================================
``single_label_classification``, or absent     ``softmax``      one choice among the labels
with ``num_labels`` >= 2                                         (the default contract)
``multi_label_classification``                 ``multi_label``  one sigmoid decision per label
                                                                 (``contracts/multi_label.toml``)
``regression`` with ``num_labels`` 1, or       ``regression``   the output value
absent with ``num_labels`` 1                                     (``contracts/regression.toml``)
============================================  ===============  =================================

Everything else is refused in one line (:class:`~variants.models.model_config.ModelConfigError`,
exit 2) naming config.json's ``problem_type`` / ``num_labels`` and what to do: an unknown
``problem_type``, a one-logit single-label head (a softmax over one logit is always 1),
multi-output regression, and sentence-transformers cross-encoders: a one-logit reranker (its
score ranks a query's candidates; ``"problem_type": "regression"`` judges the score as a value)
and a several-label pair classifier such as an NLI cross-encoder (it reads (premise, hypothesis)
as two segments, and the suite feeds one text per row: :meth:`variants.models.decision.
DecisionModel.model_inputs` renders the prompt into one segment, never a second).
"""

from pathlib import Path

from metrics._checks import short_repr
from variants.models.model_config import ModelConfigError

SOFTMAX, MULTI_LABEL, REGRESSION = "softmax", "multi_label", "regression"
#: the output kinds, in the order of the table above
KINDS = (SOFTMAX, MULTI_LABEL, REGRESSION)
#: config.json ``problem_type`` -> output kind (transformers' three values)
PROBLEM_TYPES = {"single_label_classification": SOFTMAX,
                 "multi_label_classification": MULTI_LABEL, "regression": REGRESSION}
#: config.json keys that sentence-transformers' CrossEncoder writes (v4+: the block; before: the
#: activation's name): a reranker, whose one logit scores a (query, candidate) pair
CROSS_ENCODER_KEYS = ("sentence_transformers", "sbert_ce_default_activation_function")


def read_config(folder):
    """``folder/config.json`` as a dict ({} when it is absent or unreadable: the checkpoint
    loader has already refused a bad one)."""
    import json

    try:
        return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def output_kind(config, n_out, where="config.json"):
    """The output kind (``softmax``, ``multi_label`` or ``regression``) of a head making
    ``n_out`` logits whose checkpoint's config.json is ``config``.

    Parameters
    ----------
    config : dict
        The checkpoint's config.json (``problem_type`` and the cross-encoder keys are read).
    n_out : int
        Logits the head makes (its ``num_labels``), >= 1.
    where : str
        The file named in messages.

    Raises
    ------
    ModelConfigError
        A head the suite cannot judge (see the module docstring), one line naming
        ``problem_type`` / ``num_labels`` and the fix.
    """
    pt = config.get("problem_type")
    known = ", ".join(PROBLEM_TYPES)
    if pt is not None and (not isinstance(pt, str) or pt not in PROBLEM_TYPES):
        raise ModelConfigError(f"{where}: problem_type {short_repr(pt)} is not one "
                               f"transformers knows ({known}); set one of them, or delete the key "
                               "for a single-label classifier")
    if n_out == 1 and pt is None and any(k in config for k in CROSS_ENCODER_KEYS):
        key = next(k for k in CROSS_ENCODER_KEYS if k in config)
        raise ModelConfigError(
            f"{where}: a sentence-transformers cross-encoder ({key!r}, num_labels 1): a reranker "
            "scores (query, candidate) pairs, and judging its ranking within a query's candidates "
            "is not implemented; to judge its scores as output values (absolute and relative "
            "error, rank correlation, no per-query ranking) set \"problem_type\": \"regression\" "
            "in a copy of config.json")
    if n_out >= 2 and any(k in config for k in CROSS_ENCODER_KEYS):
        key = next(k for k in CROSS_ENCODER_KEYS if k in config)
        raise ModelConfigError(
            f"{where}: a sentence-transformers cross-encoder ({key!r}, num_labels {n_out}) "
            "scores (premise, hypothesis) or (query, candidate) pairs read as two segments, and "
            "the suite feeds each row as one text (no second segment), so its labels would be "
            "judged on inputs it was never trained on; to judge it as a single-text classifier "
            f"anyway, delete {key!r} from a copy of config.json")
    kind = PROBLEM_TYPES.get(pt, SOFTMAX if n_out >= 2 else REGRESSION)
    if kind == SOFTMAX and n_out < 2:
        raise ModelConfigError(
            f"{where}: problem_type 'single_label_classification' with num_labels {n_out}: a "
            "softmax over one logit is 1 whatever the input, so nothing could be judged; set "
            "\"problem_type\": \"regression\" (a score) or \"multi_label_classification\" (a "
            "sigmoid yes/no) to say what the logit means")
    if kind == REGRESSION and n_out != 1:
        raise ModelConfigError(
            f"{where}: problem_type 'regression' with num_labels {n_out}: regression with "
            "several outputs is not judged (one output value per row is); judge one output per "
            "checkpoint (num_labels 1), or set the problem_type the head was trained for")
    return kind


def checkpoint_output_kind(checkpoint, n_out):
    """:func:`output_kind` of ``checkpoint`` (a
    :class:`~variants.checkpoints.load.Checkpoint`: its folder's config.json) for a head of
    ``n_out`` logits."""
    path = Path(checkpoint.path)
    return output_kind(read_config(path), n_out, where=f"{path / 'config.json'}")


#: what each output kind is, in refusals
DESCRIBED = {MULTI_LABEL: "one sigmoid yes/no per label (multi_label_classification)",
             REGRESSION: "one output value per row (regression)"}


def require_softmax(source, what, fix):
    """Refuse, in one line, work that trains or decides on a softmax over the options when the
    model's head outputs something else: a softmax of a regression value is 1 whatever the
    input, and per-label sigmoids are not one distribution, so such an objective would
    optimise (or decide on) nothing the head means.

    Parameters
    ----------
    source : variants.models.configured.ModelSource or None
        The bound model (its ``outputs``; None or no ``outputs``: a softmax, nothing refused).
    what : str
        What uses the softmax (e.g. "--family student distils KL(teacher || student) between
        softmaxes over the options").
    fix : str
        What to do instead.

    Raises
    ------
    ModelConfigError
        ``"<what>, but model '<name>' outputs <kind>; <fix>"``.
    """
    outputs = getattr(source, "outputs", SOFTMAX)
    if outputs == SOFTMAX:
        return
    name = getattr(source, "name", None) or "the model"
    raise ModelConfigError(f"{what}, but model {name!r} outputs {DESCRIBED[outputs]}; {fix}")
