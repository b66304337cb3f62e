"""Distilled weight quantization (DWQ): train only the scales and biases of the packed layers.

The idea of mlx-lm's ``mlx_lm.quant.dwq`` (distil a quantized model into its own fp32 teacher by
training the quantization parameters with the integer codes fixed): the codes q of every
quantized Linear stay as its initial quantizer chose them (GPTQ by default), and only its group
scales and biases train, so that the quantized model's temperature-scaled option
probabilities match the fp32 reference's on unlabelled fit-split texts:

    loss = mean over rows of KL(p_ref ‖ softmax(logits_q / T_K))

with T_K the reference's temperature for the row's option count (the loss of
:func:`variants.families.student.train.kl_to_teacher`; Hinton et al. 2015). Each layer computes
its weight as ``scales * q + biases`` per group (MLX's affine dequantization, differentiable in
the scales and biases) so ``mlx.nn.value_and_grad`` reaches them; Adam (Kingma & Ba 2015,
``mlx.optimizers.Adam``) over batches of ``batch_size`` texts, batch order shuffled per epoch
(seed 0). The texts are the fit split's only: never calibration or eval rows, no label is read.

The inference forward's fast kernels (compiled layers, the polynomial exp) have no vjp, so the
quantized model is trained through the student family's plain differentiable BERT layer
(:func:`variants.families.student.train.forward_hidden`) and the model's own readout: a linear
readout's logits, or (ChoiceModel) 20·cos against the reference's option embeddings, held
fixed. Models without such a readout, or with non-BERT layers (ModernBERT), are refused.
"""

import copy

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from metrics.softmax import masked_softmax
from variants.runtime import parallel
from variants.arch.activations import set_module

EPOCHS = 1
#: Adam moves every scale by about the learning rate per step, all layers at once: on MiniLM at
#: 4 bits (GPTQ start, 400 fit texts, one epoch) 1e-7 lowered a held-out fit KL by 10%, 3e-7
#: left it where it was and 2e-6 raised it
LEARNING_RATE = 1e-7
BATCH_SIZE = 32
#: at most this many fit texts (the first ones of the split's order): the build's cost
MAX_TEXTS = 1024


class AffineLinear(nn.Module):
    """A Linear whose weight is ``scales * q + biases`` per group of ``group_size`` inputs, with
    fixed integer codes q (o, n) and trainable ``scales``/``biases`` (o, n / group_size);
    ``input_scale`` (n,) (AWQ) multiplies the input first. ``x`` (..., n) -> (..., o)."""

    def __init__(self, codes, scales, biases, group_size, bias=None, input_scale=None):
        super().__init__()
        o, n = codes.shape
        self._codes = mx.array(np.asarray(codes, np.float32).reshape(o, n // group_size,
                                                                      group_size))
        self._shape = (o, n)
        self._input_scale = None if input_scale is None else mx.array(input_scale)
        self.scales = mx.array(np.asarray(scales, np.float32))
        self.biases = mx.array(np.asarray(biases, np.float32))
        if bias is not None:
            self.bias = bias

    def weight(self):
        """(o, n) float32 dequantized weight (what ``mx.dequantize`` gives for these tensors)."""
        return (self._codes * self.scales[..., None] + self.biases[..., None]).reshape(
            self._shape)

    def __call__(self, x):
        if self._input_scale is not None:
            x = x * self._input_scale
        y = x @ self.weight().T
        return y + self.bias if "bias" in self else y


def _teacher(reference, fit, batches):
    logits = reference.raw_logits(fit, batches)
    try:
        temp = reference.temperature_of(fit).astype(np.float32)
    except ValueError:  # an option count the calibration split lacked: no scaling there
        temp = np.array([reference.temperatures.get(int(k), 1.0) for k in fit.n_options],
                        np.float32)
    valid = np.asarray(fit.option_mask, bool)
    p = masked_softmax(logits, valid, temp).astype(np.float32)
    return [(mx.array(p[b.index]), mx.array(temp[b.index]), mx.array(valid[b.index]))
            for b in batches]


def distill(reference, layers, fit, *, epochs=EPOCHS, learning_rate=LEARNING_RATE,
            batch_size=BATCH_SIZE, max_texts=MAX_TEXTS, seed=0, progress=None):
    """Train the scales and biases of ``layers`` against the reference on ``fit``.

    Parameters
    ----------
    reference : variants.models.decision.DecisionModel — the fp32 teacher (not modified)
    layers : dict {path: (codes (o, n) uint8, scales, biases (o, n/g) float32, group_size,
        input_scale (n,) float32 or None)} — the quantized Linears of ``reference.module``
    fit : variants.datasets.tasks.TaskSet — the fit split (unlabelled use; its first ``max_texts``)

    Returns
    -------
    trained : dict {path: (scales, biases)} float32 NumPy, shapes as given: the trained ones,
        or the given ones when the KL over ``fit`` did not fall
    facts : dict — ``loss_before``, ``loss_after`` (mean KL over ``fit``), ``step_means`` (the
        mean step loss of each epoch), ``steps``, ``trained_scales_kept``

    Raises
    ------
    ValueError
        Empty ``fit``; a model whose forward cannot be differentiated (one line, naming it).
    """
    from variants.families.exit.build import _head_kind
    from variants.families.student.train import (forward_hidden, kl_to_teacher, student_logits,
                                                 trainable_encoder)

    if fit is None or len(fit) == 0:
        raise ValueError("distilled scales need fit-split texts; pass --n-fit > 0")
    try:
        kind = _head_kind(reference)
        trainable_encoder(reference.module.encoder)
    except (ValueError, AttributeError) as e:
        raise ValueError(f"distilled scales need a model they can differentiate, and "
                         f"{reference.name} is not one ({str(e).splitlines()[0]}); use "
                         "--quant-method gptq or awq") from None
    if len(fit) > max_texts:
        fit = fit.subset(np.arange(max_texts))
    module = copy.deepcopy(reference.module)
    mods = dict(module.named_modules())
    for path, (codes, scales, biases, gs, inv) in layers.items():
        set_module(module, path, AffineLinear(codes, scales, biases, gs,
                                              mods[path].get("bias"), inv))
    module.freeze()
    for _, m in module.named_modules():
        if isinstance(m, AffineLinear):
            m.unfreeze(keys=["scales", "biases"], recurse=False)
    batches, _ = reference.prepare(fit, batch_size)
    with parallel.single_stream():
        targets = _teacher(reference, fit, batches)
        options = reference._options() if kind == "cosine" else None

        def loss_fn(b, p, temp, valid):
            last, _ = forward_hidden(module, b.input_ids, b.attention_mask, b.token_type_ids)
            opts = None if options is None else options[mx.maximum(b.option_index, 0)]
            return kl_to_teacher(p, student_logits(module, kind, last, b.attention_mask, opts,
                                                   valid), temp, valid)

        def mean_loss():
            tot = 0.0
            for b, (p, temp, valid) in zip(batches, targets):
                tot += float(loss_fn(b, p, temp, valid).item()) * len(b.index)
            return tot / len(fit)

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
        before = mean_loss()
        opt = optim.Adam(learning_rate=learning_rate)
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
            step_means.append(tot / len(fit))
        after = mean_loss()
    kept = after < before  # a rise (too large a step): the starting scales are kept
    trained = {}
    for path, (_, scales, biases, _, _) in layers.items():
        m = dict(module.named_modules())[path]
        trained[path] = ((np.array(m.scales, np.float32), np.array(m.biases, np.float32))
                         if kept else (np.asarray(scales, np.float32),
                                       np.asarray(biases, np.float32)))
    return trained, {"loss_before": before, "loss_after": after, "step_means": step_means,
                     "steps": epochs * len(batches), "texts": len(fit),
                     "trained_scales_kept": bool(kept)}
