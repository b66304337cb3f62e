"""Distilled weight quantization (DWQ): train the scales and biases of the packed layers.

The idea of mlx-lm's ``mlx_lm.quant.dwq`` (distil a quantized model into its own fp32 teacher by
training the quantization parameters with the integer codes fixed): the codes q of every
quantized Linear stay as its initial quantizer chose them (:data:`INIT`: by default AWQ's
channel scales with GPTQ's codes), and only the group
scales and biases train (with ``train_norms`` also the LayerNorms' weights and biases), so that
the quantized model matches the fp32 reference on unlabelled fit-split texts:

    loss = mean over rows of KL(p_ref ‖ softmax(logits_q / T_K))
           + hidden_weight · mean over layers l of |h_q^l − h_ref^l|² / |h_ref^l|²

with T_K the reference's temperature for the row's option count (the loss of
:func:`variants.families.student.train.kl_to_teacher`; Hinton et al. 2015) and the second term
each encoder layer's output error over the real tokens, relative to the reference's (mlx-lm's
DWQ adds such an activation term at every quarter of the layers; a sentence classifier's one
distribution per text is too little signal for 330 k parameters on its own).

Relative parametrisation (:class:`RelativeAffineLinear`): each group's scale is
s0 · (1 + u θ), u = 15 / (2^bits − 1) (:func:`scale_unit`), and its bias b0 + s0 · β, with
(s0, b0) the starting quantizer's and θ, β trained from 0, so one learning rate fits every
layer (a step moves a scale by a fraction of itself and a bias by a
fraction of one code step; mlx-lm trains the raw values at 1e-6 to 1e-7 for LLM scales ~1e-3).
At θ = β = 0 the weight is exactly the start's ``scale · q + bias``. Adam (Kingma & Ba 2015,
``mlx.optimizers.Adam``) with a linear warm-up and a cosine decay to 0 over ``epochs`` passes of
``batch_size`` texts (batch order shuffled per epoch, seed 0).

With ``learn_codes`` the codes train too (:class:`LearnedCodeAffineLinear`: learned rounding
through the straight-through estimator); off by default, as on MiniLM it bought 2-5% of the
held-out KL at a stable step and diverged at five times that step (docs/quantizers.md).

The texts are the fit split's only (its first ``max_texts`` train; its last ``valid_texts``,
disjoint from them, are held out): never calibration or eval rows, no label is read. The trained
parameters are kept only when the held-out loss falls; otherwise the start is returned.

The inference forward's fast kernels (compiled layers, the polynomial exp) have no vjp, so the
quantized model is trained through the student family's plain differentiable BERT layer
(:func:`variants.families.student.train.forward_hidden`) and the model's own readout: a linear
readout's logits, a marker model's scorer at the batch's marker positions, or (ChoiceModel)
20·cos against the option embeddings of the quantized
model itself (recomputed at every step, as the variant computes them: its option texts go
through its own quantized module). Models without such a readout, or with non-BERT layers (ModernBERT), are refused.
"""

import copy
import inspect

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from metrics.softmax import masked_softmax
from variants.runtime import parallel
from variants.arch.activations import set_module
from variants.families.quant.dwq_layers import (  # noqa: F401 - dwq.AffineLinear etc.
    AffineLinear, LearnedCodeAffineLinear, RelativeAffineLinear, scale_unit)

#: the start's codes, scales and biases (a per-Linear method of
#: :mod:`variants.families.quant.learned`): "gptq", or "awq-gptq" (AWQ's channel scales, then
#: GPTQ's codes of the scaled weight). MiniLM sentiment, 4 bits, held-out fit KL of the start:
#: GPTQ 0.00534, GPTQ with act-order 0.00541, AWQ then GPTQ 0.00359 (training at 1e-4
#: raised it: see LEARNING_RATE)
INIT = "awq-gptq"
EPOCHS = 3
#: Adam's step on θ (relative scale) and β (bias in code steps), at the peak of the schedule:
#: every scale of the model moves by about this share of itself per step, all at once (Adam's
#: step is about the same for every parameter, whatever its gradient). MiniLM sentiment, 4 bits,
#: AWQ-then-GPTQ start (held-out fit KL 0.00359), 3 epochs of 1744 texts: 2e-5 -> 0.00297,
#: 4e-5 -> 0.00284; at 1e-4 the KL of a batch jumps tenfold within a dozen steps (the head
#: reads a unit-normalised mean: small hidden changes move its logits a lot)
LEARNING_RATE = 4e-5
WARMUP_SHARE = 0.05
BATCH_SIZE = 16
HIDDEN_WEIGHT = 1.0
TRAIN_NORMS = True
#: at most this many fit texts train (the first ones of the split's order): the build's cost.
#: The KL of a few options per text is little signal for the scales: 1024 texts reached a
#: held-out KL of 0.00361 where 1744 reached 0.00297 (same settings, 2e-5)
MAX_TEXTS = 4096
#: the last fit texts, held out from training: the keep-or-return-the-start decision
VALID_TEXTS = 256
#: learned rounding: the codes train too (:class:`LearnedCodeAffineLinear`). MiniLM sentiment,
#: 4 bits: held-out fit KL 2.83e-3 (codes fixed) -> 2.77e-3 at CODE_STEP 4e-3; at 2e-2 the loss
#: rose thirtyfold (the start kept); 6 bits: 2.03e-4 -> 1.97e-4. Off: not worth its risk
LEARN_CODES = False
#: a code moves by about this many code steps per Adam step at the schedule's peak
CODE_STEP = 4e-3
#: > 0: each code's offset starts at the fp32 weight's place between the start's codes,
#: clipped to ± this share of a step (AdaRound's start); 0: at the start's codes exactly
CODE_START = 0.0


def check_model(module, name="this model"):
    """ValueError (one line naming the fix) unless DWQ can train ``module``: BERT / RoBERTa
    post-norm encoder layers (:class:`variants.arch.encoder.TransformerLayer`, the plain
    differentiable layer's) and a ``readout`` from the last hidden states. Run before anything
    is built or written (the quant family's model check)."""
    from variants.arch.encoder import TransformerLayer

    layers = list(getattr(getattr(module, "encoder", None), "layers", None) or [])
    if not layers or not all(isinstance(layer, TransformerLayer) for layer in layers):
        kind = type(layers[0]).__name__ if layers else "no encoder layers"
        raise ValueError(f"--quant-method dwq trains through BERT / RoBERTa encoder layers and "
                         f"{name} has {kind}; use --quant-method gptq or awq for it")
    if not callable(getattr(module, "readout", None)):
        raise ValueError(f"--quant-method dwq needs the model's readout (its logits from the last "
                         f"hidden states) and {name} has none; use --quant-method gptq or awq")


def _readout_kind(reference):
    """'marker' (a readout of the hidden states at the batch's ``marker_pos``), else the exit
    family's 'linear' / 'cosine' (:func:`variants.families.exit.build._head_kind`)."""
    from variants.families.exit.build import _head_kind

    readout = getattr(reference.module, "readout", None)
    if callable(readout) and "marker_pos" in inspect.signature(readout).parameters:
        return "marker"
    return _head_kind(reference)


def _teacher(reference, fit, batches, hidden):
    logits = reference.raw_logits(fit, batches)
    try:
        temp = reference.temperature_of(fit).astype(np.float32)
    except ValueError:  # an option count the calibration split lacked: no scaling there
        temp = np.array([reference.temperatures.get(int(k), 1.0) for k in fit.n_options],
                        np.float32)
    valid = np.asarray(fit.option_mask, bool)
    p = masked_softmax(logits, valid, temp).astype(np.float32)
    out = []
    for b in batches:
        h = None
        if hidden:
            h = [mx.stop_gradient(x) for x in hidden(b)]
            mx.eval(h)
        out.append((mx.array(p[b.index]), mx.array(temp[b.index]), mx.array(valid[b.index]), h))
    return out


def _relative_hidden_error(hq, hr, mask):
    """mean over layers of Σ_tokens |h_q − h_ref|² / Σ_tokens |h_ref|² (real tokens only)."""
    m = mask.astype(mx.float32)[..., None]
    return sum(mx.sum(((a - b) ** 2) * m) / mx.sum((b ** 2) * m)
               for a, b in zip(hq, hr)) / len(hq)


def _norm_keys(module):
    return [path for path, m in module.named_modules() if isinstance(m, nn.LayerNorm)
            and path.startswith("encoder.layers.")]


def distill(reference, layers, fit, *, epochs=EPOCHS, learning_rate=LEARNING_RATE,
            batch_size=BATCH_SIZE, max_texts=MAX_TEXTS, valid_texts=VALID_TEXTS,
            hidden_weight=HIDDEN_WEIGHT, train_norms=TRAIN_NORMS, seed=0, progress=None,
            module=None, widths=None, learn_codes=LEARN_CODES, code_step=CODE_STEP,
            code_start=CODE_START):
    """Train the scales and biases of ``layers`` (and the encoder's LayerNorms) against the
    reference on ``fit``.

    Parameters
    ----------
    reference : variants.models.decision.DecisionModel — the fp32 teacher (not modified)
    layers : dict {path: (codes (o, n) uint8, scales, biases (o, n/g) float32, group_size,
        input_scale (n,) float32 or None)} — the quantized Linears of ``reference.module``
    fit : variants.datasets.tasks.TaskSet — the fit split (unlabelled use): its first
        ``max_texts`` train, its last ``valid_texts`` are held out (fewer when the split is
        small: a quarter of it, at least one text, when it has 2 or more)
    module : nn.Module or None — the student to train (not modified; a copy is): the
        reference's module with the parts the variant quantizes but DWQ does not learn (an
        embedding table, a head: round-to-nearest, dequantized) already in place, so the
        trained scales and norms compensate for them too; None: the reference's own
    widths : dict {path: bits} or None — each layer's width (:func:`scale_unit`); None: 4
    learn_codes, code_step, code_start — learned rounding (:data:`LEARN_CODES`,
        :data:`CODE_STEP`, :data:`CODE_START`): the codes train too, then are rounded

    Returns
    -------
    trained : dict {path: (codes (o, n) uint8, scales, biases (o, n/g) float32)} NumPy — the
        trained ones (the codes as given unless ``learn_codes``), or the given ones when the
        held-out loss did not fall
    norms : dict {name: (D,) float32 NumPy} — trained LayerNorm weights and biases (named as in
        ``reference.module.parameters()``), empty when not trained or not kept
    facts : dict — ``loss_before``, ``loss_after`` (mean held-out loss), ``kl_before``,
        ``kl_after`` (its KL part), ``step_means`` (mean step loss per epoch), ``steps``,
        ``texts``, ``valid_texts``, ``trained_scales_kept``

    Raises
    ------
    ValueError
        Empty ``fit``; a model whose forward cannot be differentiated (one line, naming it).
    """
    from variants.families.student.train import (forward_hidden, kl_to_teacher, student_logits,
                                                 trainable_encoder)

    if fit is None or len(fit) == 0:
        raise ValueError("distilled scales need fit-split texts; pass --n-fit > 0")
    try:
        kind = _readout_kind(reference)
        trainable_encoder(reference.module.encoder)
    except (ValueError, AttributeError) as e:
        raise ValueError(f"distilled scales need a model they can differentiate, and "
                         f"{reference.name} is not one ({str(e).splitlines()[0]}); use "
                         "--quant-method gptq or awq") from None
    n_valid = min(valid_texts, len(fit) // 4) if len(fit) >= 2 else 0
    n_valid = max(n_valid, 1) if len(fit) >= 2 else 0
    train = fit.subset(np.arange(min(max_texts, len(fit) - n_valid)))
    held = fit.subset(np.arange(len(fit) - n_valid, len(fit))) if n_valid else train
    module = copy.deepcopy(reference.module if module is None else module)
    mods = dict(module.named_modules())
    code_unit = code_step / learning_rate if learning_rate > 0 else 1.0
    for path, (codes, scales, biases, gs, inv) in layers.items():
        bits = (widths or {}).get(path, 4)
        unit = scale_unit(bits)
        if learn_codes:
            start = None
            if code_start > 0:  # the fp32 weight's place between the codes, in code steps
                W = np.array(mods[path].weight, np.float32)
                W = W if inv is None else W / np.asarray(inv, np.float32)
                o, n = W.shape
                r = ((W.reshape(o, n // gs, gs) - np.asarray(biases)[..., None])
                     / np.asarray(scales)[..., None] - np.asarray(codes).reshape(o, n // gs, gs))
                start = np.clip(r, -code_start, code_start)
            layer = LearnedCodeAffineLinear(codes, scales, biases, gs, mods[path].get("bias"),
                                            inv, unit, bits, start, code_unit)
        else:
            layer = RelativeAffineLinear(codes, scales, biases, gs, mods[path].get("bias"), inv,
                                         unit)
        set_module(module, path, layer)
    module.freeze()
    for path, m in module.named_modules():
        if isinstance(m, RelativeAffineLinear):
            keys = ["scale_delta", "bias_delta"] + (["code_delta"] if learn_codes else [])
            m.unfreeze(keys=keys, recurse=False)
    norm_paths = _norm_keys(module) if train_norms else []
    for path in norm_paths:
        dict(module.named_modules())[path].unfreeze(keys=["weight", "bias"], recurse=False)

    def ref_hidden(b):
        return forward_hidden(reference.module, b.input_ids, b.attention_mask,
                              b.token_type_ids)[1]

    hidden = ref_hidden if hidden_weight > 0 else None
    with parallel.single_stream():
        batches, _ = reference.prepare(train, batch_size)
        vbatches, _ = reference.prepare(held, batch_size)
        targets = _teacher(reference, train, batches, hidden)
        vtargets = _teacher(reference, held, vbatches, hidden)
        if kind == "cosine":  # the variant embeds the option texts with its own module
            encs, _ = reference.tokenizer.encode(reference.option_texts)
            option_batch = [mx.array(a) for a in reference.tokenizer.batch(encs)]

        def student_options():
            last, _ = forward_hidden(module, *option_batch)
            return module.readout(last, option_batch[1])

        def losses(b, p, temp, valid, h_ref):
            last, hq = forward_hidden(module, b.input_ids, b.attention_mask, b.token_type_ids)
            if kind == "marker":  # the hidden states at the option markers, scored
                logits = module.readout(last, b.attention_mask, b.extra["marker_pos"])
            else:
                opts = None if kind != "cosine" else \
                    student_options()[mx.maximum(b.option_index, 0)]
                logits = student_logits(module, kind, last, b.attention_mask, opts, valid)
            kl = kl_to_teacher(p, logits, temp, valid)
            if h_ref is None:
                return kl, kl
            return kl + hidden_weight * _relative_hidden_error(hq, h_ref, b.attention_mask), kl

        def loss_fn(*args):
            return losses(*args)[0]

        def held_out():
            tot = kl_tot = 0.0
            for b, t in zip(vbatches, vtargets):
                loss, kl = losses(b, *t)
                tot += float(loss.item()) * len(b.index)
                kl_tot += float(kl.item()) * len(b.index)
            return tot / len(held), kl_tot / len(held)

        step = nn.value_and_grad(module, loss_fn)
        try:
            loss, grads = step(batches[0], *targets[0])
            mx.eval(loss, grads)
            why = None if any(float(mx.abs(g).sum()) > 0 for _, g in tree_flatten(grads)) \
                else "every gradient of the scales is 0: the forward leaves MLX's graph"
        except Exception as e:  # noqa: BLE001 - any failure of autodiff through the forward
            why = f"{type(e).__name__}: {e}".splitlines()[0]
        if why:
            raise ValueError(f"distilled scales need a differentiable model forward, and "
                             f"{reference.name}'s is not ({why}); use --quant-method gptq or awq")
        before, kl_before = held_out()
        total = epochs * len(batches)
        warm = max(1, int(round(WARMUP_SHARE * total)))
        schedule = optim.join_schedules(
            [optim.linear_schedule(learning_rate / warm, learning_rate, warm),
             optim.cosine_decay(learning_rate, max(total - warm, 1))], [warm])
        opt = optim.Adam(learning_rate=schedule)
        rng = np.random.default_rng(seed)
        step_means = []
        for _ in range(epochs):
            tot = 0.0
            for j in rng.permutation(len(batches)):
                loss, grads = step(batches[j], *targets[j])
                opt.update(module, grads)
                mx.eval(module.trainable_parameters(), opt.state, loss)
                tot += float(loss.item()) * len(batches[j].index)
                if progress is not None:
                    progress(len(batches[j].index))
            step_means.append(tot / len(train))
        after, kl_after = held_out()
    kept = after < before  # a rise (too large a step): the start is returned
    mods = dict(module.named_modules())
    trained = {}
    for path, (codes, scales, biases, _, _) in layers.items():
        m = mods[path]
        trained[path] = ((m.codes() if learn_codes else np.asarray(codes, np.uint8),
                          np.array(m.group_scales(), np.float32),
                          np.array(m.group_biases(), np.float32))
                         if kept else (np.asarray(codes, np.uint8), np.asarray(scales, np.float32),
                                       np.asarray(biases, np.float32)))
    norms = {}
    if kept:
        for path in norm_paths:
            norms[f"{path}.weight"] = np.array(mods[path].weight, np.float32)
            norms[f"{path}.bias"] = np.array(mods[path].bias, np.float32)
    return trained, norms, {"loss_before": before, "loss_after": after, "kl_before": kl_before,
                            "kl_after": kl_after, "step_means": step_means, "steps": total,
                            "texts": len(train), "valid_texts": n_valid,
                            "trained_scales_kept": bool(kept)}
