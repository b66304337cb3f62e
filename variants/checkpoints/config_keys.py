"""config.json keys that change what a checkpoint computes but that no loader here implements:
refused in one line, never ignored (a YaRN-scaled ModernBERT or a relative-position BERT would
otherwise load with the wrong positions, silently).

Checked for every architecture before it is built (:func:`variants.checkpoints.load._build`);
the values that mean "the plain computation" (``position_embedding_type: "absolute"``,
``rope_type: "default"``, ``rope_scaling: null``, ``is_decoder: false``) pass.
"""

from metrics._checks import short_repr

from variants.checkpoints.files import CheckpointError


def _rope_types(config):
    """Every ``rope_type`` / ``type`` named by ``rope_scaling`` or ``rope_parameters`` (flat,
    or per layer type as transformers 5 writes ModernBERT's), as (key path, value)."""
    found = []
    scaling = config.get("rope_scaling")
    if scaling:  # transformers 4.x: {"rope_type" or "type": "yarn", "factor": ...}
        found.append(("rope_scaling", scaling.get("rope_type", scaling.get("type", scaling))
                      if isinstance(scaling, dict) else scaling))
    params = config.get("rope_parameters")
    if isinstance(params, dict):
        groups = params.items() if all(isinstance(v, dict) for v in params.values()) else \
            [("", params)]
        for name, group in groups:
            rt = group.get("rope_type", "default")
            if rt != "default":
                found.append((f"rope_parameters.{name}.rope_type".replace("..", "."), rt))
    return found


#: ``architectures[0]`` suffixes of heads that are not a sequence classifier (the encoder alone
#: would be judged under a head it does not have)
_OTHER_HEADS = {"ForTokenClassification": "a per-token classifier",
                "ForMultipleChoice": "a multiple-choice scorer (one logit per choice)",
                "ForQuestionAnswering": "a span extractor", "ForCausalLM": "a causal LM"}


def refuse_other_heads(config, config_file):
    """Raise CheckpointError (one line) when ``architectures[0]`` names a head that is not a
    sequence classifier (``*ForTokenClassification``, ``*ForMultipleChoice``,
    ``*ForQuestionAnswering``, ``*ForCausalLM``): its weights would be read as the wrong head,
    or refused as a mismatch that names the wrong cause. Base models, ``*ForMaskedLM`` and
    ``*ForPreTraining`` load as encoders without a head."""
    arch = str((config.get("architectures") or [""])[0])
    for suffix, what in _OTHER_HEADS.items():
        if arch.endswith(suffix):
            raise CheckpointError(
                f"{config_file} names {arch}, {what}, which is not judged here (sequence "
                "classifiers and bare encoders are); use a *ForSequenceClassification or bare "
                "encoder checkpoint (save_pretrained of its base model)")


def refuse_unimplemented(config, config_file):
    """Raise CheckpointError (one line: the file, the key, its value and the fix) when
    ``config`` (a config.json dict) sets a key that changes the computation and is not
    implemented: ``position_embedding_type`` other than ``absolute`` (Shaw et al. 2018 /
    Huang et al. 2020 relative positions), ``rope_scaling`` or a ``rope_type`` other than
    ``default`` (linear, dynamic NTK, YaRN, LongRoPE), ``is_decoder`` or
    ``add_cross_attention`` true (a causal or cross-attending stack); and heads that are not a
    sequence classifier (:func:`refuse_other_heads`)."""
    refuse_other_heads(config, config_file)
    pet = config.get("position_embedding_type")
    if pet not in (None, "absolute"):
        raise CheckpointError(
            f"{config_file} sets position_embedding_type {short_repr(pet)}, which is not "
            "implemented (only absolute positions are); use a checkpoint with absolute "
            "positions")
    for key, value in _rope_types(config):
        raise CheckpointError(
            f"{config_file} sets {key} {short_repr(value)}, which is not implemented (only "
            "unscaled rotary positions are); use a checkpoint without rope scaling")
    for key in ("is_decoder", "add_cross_attention"):
        if config.get(key):
            raise CheckpointError(
                f"{config_file} sets {key} true, which is not implemented (encoders with "
                "bidirectional self-attention only); use the encoder checkpoint")
