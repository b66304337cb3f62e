"""Distilling a shallower student from the reference (the teacher), in MLX, and caching it.

The student is the teacher's decision module with fewer encoder layers: its k layers are copies
of teacher layers (:func:`init_layers`: 'even' = round((j + 1)·N/k) − 1, the uniform layer map
g(j) of TinyBERT, Jiao et al. 2020, §3.1; 'first' = 0..k−1), and it shares the teacher's
embeddings and decision head (the fitted linear head, a checkpoint's classifier, or the cosine
scoring against the teacher's option embeddings), which stay frozen: only the k layers train.
Sharing the head is what makes the contract reachable at all: the student must reproduce the
*teacher's* logits in the teacher's own output space, so that the fallback's rows and the
student's rows are read by one head, one temperature and one contract.

Loss (per batch, mean over rows; Hinton et al. 2015): KL(p_T ‖ p_S) with
p = softmax(logits / T_K) over the row's valid options at the teacher's fitted temperature T_K,
plus, with ``hidden_weight`` w > 0, w · mean_j MSE(h_S^j, h_T^{g(j)}) over real tokens
(TinyBERT's hidden-state loss, without its learnable projection: widths are equal). Optimiser
AdamW (Loshchilov & Hutter 2019; ``mlx.optimizers.AdamW``, weight decay 0.01) on
``mlx.nn.value_and_grad``; batches of 32 texts sorted by length (little padding), batch order
shuffled per epoch (seed 0). fp32 on the CPU.

Training texts: the fit split plus the unlabelled rest of the training texts (the bundled
models: the VADER fit split's other items; never calibration or eval items, whose ids hash to
other splits), at most ``train_texts``; the teacher's outputs are the targets, no label is read.

Students are cached as safetensors (``mx.save_safetensors``) under
``cache_dir/students/<model>-<key>.safetensors``, key = :meth:`DecisionModel.cache_key` over the
teacher's weights, the training data's fingerprint and the training config; the file also holds
the loss curve and the training seconds.
"""

import copy
import os
import time
from dataclasses import fields, replace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from metrics.softmax import masked_softmax
from variants.families.exit.heads import cosine_logits, module_digest
from variants.families.student.config import TRAIN_BATCH

VERSION = "student-kl-v1"
WEIGHT_DECAY = 0.01


def init_layers(n_teacher, k, init="even"):
    """Teacher layer indices (0-based) copied into a k-layer student: 'even' = round((j+1)·N/k)−1
    for j < k (k=1 of 6 -> [5]; 2 -> [2, 5]; 3 -> [1, 3, 5]), 'first' = [0, .., k−1].

    Raises
    ------
    ValueError
        k outside [1, N), or an unknown ``init``.
    """
    if not 1 <= k < n_teacher:
        raise ValueError(f"--student-layers {k} must be in 1..{n_teacher - 1} (fewer than the "
                         f"teacher's {n_teacher} layers)")
    if init == "even":
        return [int(round((j + 1) * n_teacher / k)) - 1 for j in range(k)]
    if init == "first":
        return list(range(k))
    raise ValueError(f"--student-init {init!r} is not known; choose even or first")


def make_student(module, layers):
    """A copy of decision module ``module`` whose encoder runs deep copies of teacher layers
    ``layers`` (0-based); embeddings, final norm and head are shared with ``module``."""
    enc = copy.copy(module.encoder)
    enc.layers = [copy.deepcopy(module.encoder.layers[i]) for i in layers]
    student = copy.copy(module)
    student.encoder = enc
    return student


def layer_params(student):
    """{name: mx.array} of the student's own (trained) weights: its encoder layers."""
    return dict(tree_flatten({"layers": student.encoder.parameters()["layers"]}))


_PLAIN_ACT = {"gelu": nn.gelu, "gelu_exact": nn.gelu, "gelu_new": nn.gelu_approx,
              "gelu_pytorch_tanh": nn.gelu_approx, "relu": nn.relu}


def plain_layer(layer, x, bias):
    """A post-norm BERT layer (:class:`variants.arch.encoder.TransformerLayer`) in plain,
    differentiable MLX ops (the inference paths' fused exp has no vjp): softmax attention,
    ``mx.fast.layer_norm``, the exact / tanh GELU of its ``hidden_act``. Same function as the
    layer's own forward up to float32 round-off."""
    att = layer.attention
    B, L, D = x.shape
    q = att.heads(att.query(x) * att.scale, B, L)
    k, v = att.heads(att.key(x), B, L), att.heads(att.value(x), B, L)
    s = q @ k.transpose(0, 1, 3, 2)
    if bias is not None:
        s = s + bias
    ctx = (mx.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, L, D)
    n1, n2 = layer.attention_norm, layer.output_norm
    x = mx.fast.layer_norm(x + att.out(ctx), n1.weight, n1.bias, n1.eps)
    h = layer.output(_PLAIN_ACT[layer.hidden_act](layer.intermediate(x)))
    return mx.fast.layer_norm(x + h, n2.weight, n2.bias, n2.eps)


def trainable_encoder(encoder):
    """Raise ValueError unless ``encoder``'s layers can be trained here (BERT / RoBERTa
    post-norm layers, :class:`variants.arch.encoder.TransformerLayer`)."""
    from variants.arch.encoder import TransformerLayer

    if not all(isinstance(layer, TransformerLayer) for layer in encoder.layers):
        raise ValueError(f"--family student trains BERT / RoBERTa encoder layers; this model's "
                         f"are {type(encoder.layers[0]).__name__}: choose --family quant, "
                         "lowrank, prune or exit for it")


def forward_hidden(module, ids, mask, types):
    """(last hidden after ``finish`` (B, L, D), [each layer's output]) in plain differentiable
    ops (:func:`plain_layer`); the embeddings (frozen, shared) run as in inference."""
    from variants.arch.encoder import attention_bias

    enc = module.encoder
    x = mx.stop_gradient(enc.embed(ids, types))
    bias = None if bool(mask.all().item()) else attention_bias(mask, x.dtype)
    hidden = []
    for layer in enc.layers:
        x = plain_layer(layer, x, bias)
        hidden.append(x)
    return enc.finish(x), hidden


def student_logits(module, kind, last, mask, opts=None, valid=None):
    """(B, K) raw logits of the shared head on the student's last hidden state: the readout's
    logits ('linear'), or 20·cos(readout embedding, option embedding) ('cosine')."""
    out = module.readout(last, mask)
    return out if kind == "linear" else cosine_logits(out, opts, valid)


def kl_to_teacher(p_teacher, logits, temperature, valid):
    """mx scalar: mean over rows of KL(p_T ‖ softmax(logits / T)) over valid options.

    Parameters
    ----------
    p_teacher : mx (B, K) float32, rows summing to 1, 0 at invalid options
    logits : mx (B, K) raw student logits
    temperature : mx (B,) float32 > 0
    valid : mx (B, K) bool
    """
    z = mx.where(valid, logits / temperature[:, None], -1e9)
    logq = z - mx.logsumexp(z, axis=-1, keepdims=True)
    logp = mx.log(mx.maximum(p_teacher, 1e-30))
    return mx.mean(mx.sum(mx.where(valid & (p_teacher > 0), p_teacher * (logp - logq), 0.0),
                          axis=-1))


def hidden_mse(student_hidden, teacher_hidden, mask):
    """mx scalar: mean over student layers j of the MSE (per real token and feature) between
    h_S^j and the matched teacher state (TinyBERT Eq. 8 without the projection)."""
    m = mask.astype(mx.float32)[..., None]
    n = mx.maximum(m.sum() * student_hidden[0].shape[-1], 1.0)
    return sum(mx.sum(((hs - ht) ** 2) * m) / n
               for hs, ht in zip(student_hidden, teacher_hidden)) / len(student_hidden)


def training_set(reference, fit, train_texts):
    """(TaskSet, source sentence): the fit split plus the unlabelled rest of the bundled fit
    split (items not in ``fit``) up to ``train_texts`` texts; ``train_texts`` of the fit texts
    (seeded) when the fit split has that many; the fit split alone for a model whose data the
    builder cannot draw (own data, factories)."""
    from variants.datasets import bundled as data
    from variants.models import MODELS, get_module

    if len(fit) >= train_texts:
        pick = np.sort(np.random.default_rng(0).permutation(len(fit))[:train_texts])
        return fit.subset(pick), f"{train_texts} of the {len(fit)} fit texts (seed 0)"
    if reference.name not in MODELS:
        return fit, f"the fit split ({len(fit)} texts; no bundled remainder for this model)"
    frame = data.split_frame(data.load_vader(), "fit")
    frame = frame[~frame["id"].astype(str).isin(set(map(str, fit.ids)))].reset_index(drop=True)
    extra = data.sample(frame, min(train_texts - len(fit), len(frame)), seed=0)
    rest = get_module(reference.name).make_taskset(extra)
    rest = replace(rest, labels=np.full(len(rest), -1, np.int64))  # unlabelled: none is read
    return (concat_tasksets(fit, rest),
            f"fit split ({len(fit)}) + {len(rest)} unlabelled texts of the rest of the fit split")


def concat_tasksets(a, b):
    """The rows of TaskSet ``a`` then ``b`` (same option width K and action names)."""
    kw = {}
    for f in fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if f.name == "action_names":
            kw[f.name] = va
        elif va is None or vb is None:
            kw[f.name] = None if va is None and vb is None else np.concatenate([
                np.full(len(a), "", object) if va is None else va,
                np.full(len(b), "", object) if vb is None else vb]).astype(str)
        else:
            kw[f.name] = np.concatenate([va, vb])
    return type(a)(**kw)


def teacher_targets(reference, taskset, batches, kind):
    """Per batch (aligned with ``batches``): teacher probabilities (B, K) float32 at its
    temperature, the temperatures (B,), valid options (B, K) and the option embeddings
    (B, K, D) for 'cosine' (None for 'linear')."""
    logits = reference.raw_logits(taskset, batches)
    temp = reference.temperature_of(taskset).astype(np.float32)
    valid = np.asarray(taskset.option_mask, bool)
    p = masked_softmax(logits, valid, temp).astype(np.float32)
    O = reference._options() if kind == "cosine" else None
    out = []
    for b in batches:
        opts = O[mx.maximum(b.option_index, 0)] if kind == "cosine" else None
        out.append((mx.array(p[b.index]), mx.array(temp[b.index]), mx.array(valid[b.index]),
                    opts))
    return out


def distill(reference, student, teacher_layers, taskset, kind, *, epochs, lr, hidden_weight,
            seed=0, progress=None):
    """Train ``student``'s layers in place.

    Returns
    -------
    curve : list of float, epochs + 1 — the loss over the whole training set (no update) before
        training (entry 0) and after each epoch
    step_means : list of float, epochs — the mean of each epoch's step losses (while training)
    """
    batches, _ = reference.prepare(taskset, batch_size=TRAIN_BATCH)
    targets = teacher_targets(reference, taskset, batches, kind)
    trainable = nn.Module()  # only the student's own layers train (embeddings, head: shared)
    trainable.layers = student.encoder.layers
    teacher = reference.module

    def loss_fn(ids, mask, types, p, temp, valid, opts, t_hidden):
        last, hidden = forward_hidden(student, ids, mask, types)
        loss = kl_to_teacher(p, student_logits(student, kind, last, mask, opts, valid), temp,
                             valid)
        if hidden_weight:
            loss = loss + hidden_weight * hidden_mse(hidden, t_hidden, mask)
        return loss

    def t_hidden_of(b):
        if not hidden_weight:
            return None
        _, h = forward_hidden(teacher, b.input_ids, b.attention_mask, b.token_type_ids)
        return [mx.stop_gradient(h[i]) for i in teacher_layers]

    def epoch_loss():
        tot = 0.0
        for b, (p, temp, valid, opts) in zip(batches, targets):
            v = loss_fn(b.input_ids, b.attention_mask, b.token_type_ids, p, temp, valid, opts,
                        t_hidden_of(b))
            tot += float(v.item()) * len(b.index)
        return tot / len(taskset)

    curve, step_means = [epoch_loss()], []
    opt = optim.AdamW(learning_rate=lr, weight_decay=WEIGHT_DECAY)
    step = nn.value_and_grad(trainable, loss_fn)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        tot = 0.0
        for j in rng.permutation(len(batches)):
            b, (p, temp, valid, opts) = batches[j], targets[j]
            loss, grads = step(b.input_ids, b.attention_mask, b.token_type_ids, p, temp, valid,
                               opts, t_hidden_of(b))
            opt.update(trainable, grads)
            mx.eval(trainable.parameters(), opt.state, loss)
            tot += float(loss.item()) * len(b.index)
            if progress is not None:
                progress(len(b.index))
        step_means.append(tot / len(taskset))
        curve.append(epoch_loss())
    return curve, step_means


def trained_student(reference, cfg, kind, fit, cache_dir=None, log=None):
    """The k-layer student of ``cfg`` (:class:`StudentConfig`), trained or loaded from the cache.

    Returns
    -------
    student : nn.Module (the decision module with k layers)
    info : dict — ``init_layers``, ``training`` {epochs, n_train, source, curve, train_s, lr,
        hidden_weight, loss}, ``student_cache_key``, ``student_cached`` (bool)
    """
    t = cfg.training
    n = len(reference.module.encoder.layers)
    idx = init_layers(n, t["layers"], t["init"])
    taskset, source = training_set(reference, fit, t["train_texts"])
    key = reference.cache_key(module_digest(reference.module), taskset.fingerprint(), t,
                              TRAIN_BATCH, WEIGHT_DECAY, VERSION)
    path = None if cache_dir is None else (
        cache_dir / "students" / f"{reference.name}-{key}.safetensors")
    student = make_student(reference.module, idx)
    info = {"init_layers": idx, "student_cache_key": key}
    tr = {"epochs": t["epochs"], "n_train": len(taskset), "source": source, "lr": t["lr"],
          "hidden_weight": t["hidden_weight"], "batch_size": TRAIN_BATCH,
          "optimizer": f"AdamW (weight decay {WEIGHT_DECAY})",
          "loss": "KL(teacher ‖ student) at the teacher's temperature"
                  + (f" + {t['hidden_weight']} · hidden MSE" if t["hidden_weight"] else ""),
          "curve_note": "loss over the training texts (no update) before training (epoch 0) "
                        "and after each epoch"}
    if path is not None and path.exists():
        from runs.readers import CorruptFileError

        try:
            arrays = mx.load(str(path))
            curve = np.asarray(arrays.pop("_curve")).tolist()
            train_s = float(np.asarray(arrays.pop("_train_s")))
            student.encoder.update(tree_unflatten(list(arrays.items())), strict=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is corrupt
            raise CorruptFileError(path, "student cache file", f"{type(e).__name__}: {e}") \
                from None
        return student, {**info, "student_cached": True,
                         "training": {**tr, "curve": curve, "train_s": train_s}}
    t0 = time.perf_counter()
    curve, step_means = distill(reference, student, idx, taskset, kind, epochs=t["epochs"],
                                lr=t["lr"], hidden_weight=t["hidden_weight"])
    train_s = time.perf_counter() - t0
    if log is not None:
        log(f"student with {t['layers']} layers trained in {train_s:.1f} s, loss "
            + " -> ".join(f"{v:.4f}" for v in curve))
    if path is not None:
        arrays = layer_params(student)
        arrays["_curve"] = mx.array(np.asarray(curve, np.float32))
        arrays["_train_s"] = mx.array(np.float32(train_s))
        _save(path, arrays)
    return student, {**info, "student_cached": False,
                     "training": {**tr, "curve": curve, "train_s": train_s,
                                  "step_loss_means": step_means}}


def _save(path, arrays):
    """``mx.save_safetensors`` to a temp file next to ``path``, renamed into place (atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.safetensors")
    try:
        mx.save_safetensors(str(tmp), arrays)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
