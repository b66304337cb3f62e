"""DecisionModel: the small interface every model (ours or a user's) implements.

A subclass sets ``module`` (the ``nn.Module`` that builders transform) and implements
:meth:`DecisionModel.forward`: one prepared batch in, raw option logits out. The base class
tokenises, batches, applies one temperature per option count and derives every output in
:class:`runs.outputs.DecisionOutputs`.
"""

import copy
import warnings
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from metrics.temperature_fit import fits_by_bucket
from runs.io import digest
from runs.outputs import finish_outputs


@dataclass
class PreparedBatch:
    """One tokenised batch. ``index`` (B,) are positions in the TaskSet; arrays are (B, L) int32;
    ``option_index`` (B, K) int32 points into the model's list of option texts (-1 = no option)."""

    index: np.ndarray
    input_ids: mx.array
    attention_mask: mx.array
    token_type_ids: mx.array
    option_index: mx.array
    n_tokens: int = 0
    extra: dict = field(default_factory=dict)


def prepared_digest(batches):
    """16 hex digits over the prepared tensors of ``batches`` (list of :class:`PreparedBatch`):
    each batch's ``index``, ``input_ids``, ``attention_mask``, ``token_type_ids`` and
    ``option_index`` (bytes, shape and dtype), in order. A cache-key part for outputs computed
    from these batches: it changes with the batch size (padding to each batch's longest, which
    moves logits by ~1e-6) and with any tokenizer setting, whether or not the setting is named."""
    import hashlib

    h = hashlib.sha256()
    for b in batches:
        for a in (b.index, b.input_ids, b.attention_mask, b.token_type_ids, b.option_index):
            a = np.asarray(a)
            h.update(repr((a.shape, a.dtype.str)).encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class DecisionModel:
    """Base class: subclasses implement ``forward(batch) -> (B, K) logits``.

    Parameters
    ----------
    module : mlx.nn.Module
        Everything with weights; builders (quantize, low rank, ...) return a transformed copy.
    tokenizer : variants.checkpoints.load.TextTokenizer
    temperatures : dict {int: float}, optional
        Temperature per option count K; fitted by :meth:`calibrate` when missing.
    """

    name = "decision-model"
    #: Template of what the model reads ({text}, {question}, {options}; None = the text as is)
    #: and the {question} filled in (:mod:`variants.models.model_config`'s ``prompt`` / ``question``).
    prompt = None
    question = ""
    #: {K: T} fixed temperatures (``[temperature] mode = "fixed"``); None = fitted.
    fixed_temperatures = None
    #: where the head and temperatures came from (``source``, ``sha256``, ``from``), set by
    #: :func:`variants.models.fitted_reference`; None for a model fitted or loaded otherwise
    fitted_record = None

    def __init__(self, module, tokenizer, temperatures=None):
        self.module = module
        self.tokenizer = tokenizer
        self.temperatures = dict(temperatures or {})
        #: {K: {"temperature", "status", "nll", "n", "reason"}} of the last :meth:`calibrate`
        #: (or the head cache); empty when the temperatures were given.
        self.temperature_fits = {}
        self.option_texts = []  # unique option wordings seen by prepare()
        self.last_exit_layer = None  # (N,) layers run per example of the last raw_logits call

    # -- what a subclass implements -------------------------------------------------------
    def forward(self, batch):
        """Raw option logits for one :class:`PreparedBatch`: mx.array (B, K) float32."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward(batch)")

    def config(self):
        """JSON-able description that identifies this model's outputs (a cache-key part)."""
        return {"name": self.name, "temperatures": self.temperatures}

    def settings_config(self):
        """The prompt and fixed temperatures when set (a :meth:`config` part; {} by default)."""
        out = {}
        if self.prompt not in (None, "{text}"):
            out.update(prompt=self.prompt, question=self.question)
        if self.fixed_temperatures is not None:
            out["fixed_temperatures"] = {str(k): v for k, v in self.fixed_temperatures.items()}
        return out

    def cache_key(self, *parts):
        """16 hex digits over ``parts`` (weights, data fingerprints, versions: the caller's), this
        model's :meth:`config` and its tokenizer's ``fingerprint()`` (max length, truncation,
        padding, special tokens, normalizer, vocabulary). Every cache under ``results/.cache``
        keys through here, so none can miss a tokenizer setting. A tokenizer without
        ``fingerprint()`` is keyed by its type name only (give yours one). The device, GPU
        backend and dtype computed on (:func:`variants.runtime.device.key_part`) join too: outputs of
        another device are recomputed, never mixed; so do the package and MLX versions and the
        compute path (compiled kernel, fused layers, stream split:
        :func:`variants.arch.compute_path.key_part`)."""
        from variants.arch import compute_path
        from variants.runtime import device

        fp = getattr(self.tokenizer, "fingerprint", None)
        tok = fp() if callable(fp) else type(self.tokenizer).__qualname__
        return digest(*parts, {"model": self.config(), "tokenizer": tok,
                               "device": device.key_part(),
                               "compute": compute_path.key_part()})

    # -- shared machinery -----------------------------------------------------------------
    def replace_module(self, module):
        """A shallow copy of this model with ``module`` swapped in (head state is shared)."""
        other = copy.copy(self)
        other.module = module
        other.temperatures = dict(self.temperatures)
        # option_texts stays shared on purpose: batches prepared by any of the models index it
        other._reset_caches()
        return other

    def _reset_caches(self):
        pass

    def prepare(self, taskset, batch_size=32):
        """Tokenise ``taskset`` and cut it into length-sorted batches (less padding).

        Returns
        -------
        batches : list of PreparedBatch
        n_truncated : int
            Texts cut at the tokenizer's ``max_length``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        texts, pairs = self.model_inputs(taskset)
        encs, n_truncated = (self.tokenizer.encode(texts) if pairs is None
                             else self.tokenizer.encode(texts, pairs))
        lookup = {t: i for i, t in enumerate(self.option_texts)}
        opt = np.full(taskset.option_texts.shape, -1, np.int32)
        for (i, k), text in np.ndenumerate(taskset.option_texts):
            if taskset.option_mask[i, k]:
                if text not in lookup:
                    lookup[text] = len(self.option_texts)
                    self.option_texts.append(text)
                opt[i, k] = lookup[text]
        order = np.argsort([len(e.ids) for e in encs], kind="stable")
        batches = []
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask, types = self.tokenizer.batch([encs[i] for i in idx])
            batches.append(PreparedBatch(idx, mx.array(ids), mx.array(mask), mx.array(types),
                                         mx.array(opt[idx]), int(mask.sum())))
        return batches, n_truncated

    def render_options(self, options):
        """The {options} of the prompt for one row's list of option texts: joined by " / "."""
        return " / ".join(options)

    def model_inputs(self, taskset):
        """(texts, pairs) the tokenizer encodes for ``taskset``: the texts as they are without a
        ``prompt``, else the prompt rendered per row ({question}: the row's own when the TaskSet
        has ``questions`` and it is not empty, else ``self.question``); ``pairs`` None."""
        if self.prompt in (None, "{text}"):
            return list(taskset.texts), None
        qs = getattr(taskset, "questions", None)
        qs = [q if q else self.question for q in qs] if qs is not None \
            else [self.question] * len(taskset)
        return [self.prompt.format(text=t, question=q, options=self.render_options(
            [o for o, m in zip(opts, mask) if m]))
            for t, q, opts, mask in zip(taskset.texts, qs, taskset.option_texts,
                                        taskset.option_mask)], None

    def raw_logits(self, taskset, batches=None, progress=None):
        """(N, K) float32 NumPy logits for the whole TaskSet, in TaskSet order.

        When the module reports a per-row ``last_exit_layer`` after each forward (early exit),
        the (N,) int64 layers run per example are left in ``self.last_exit_layer`` (None
        otherwise, or when some batch reported none).
        """
        if batches is None:
            batches, _ = self.prepare(taskset)
        out = np.zeros(taskset.option_mask.shape, np.float32)
        tracks = hasattr(self.module, "last_exit_layer")
        exit_layer = np.full(len(out), -1, np.int64) if tracks else None
        for b in batches:
            if tracks:
                self.module.last_exit_layer = None
            logits = self.forward(b)
            mx.eval(logits)
            out[b.index] = np.array(logits.astype(mx.float32))  # bfloat16 has no NumPy dtype
            if tracks:
                el = self.module.last_exit_layer
                if el is None or len(el) != len(b.index):
                    tracks, exit_layer = False, None
                else:
                    exit_layer[b.index] = np.asarray(el, np.int64)
            if progress is not None:
                progress(len(b.index))
        self.last_exit_layer = exit_layer if tracks and (exit_layer >= 0).all() else None
        return out

    def calibrate(self, taskset, batches=None):
        """Fit one temperature per option count on ``taskset`` (the calibration split); each fit's
        status ("converged", "at_bound", "not_converged", warned unless converged) is kept in
        ``temperature_fits``. With ``fixed_temperatures`` those are taken as they are (status
        "fixed"; ValueError when an option count of ``taskset`` has none). An option count
        without any labelled row gets T = 1.0 (status "no_labels") and a UserWarning."""
        k = taskset.n_options
        if self.fixed_temperatures is not None:
            missing = sorted(set(k.tolist()) - set(self.fixed_temperatures))
            if missing:
                raise ValueError(f"no fixed temperature for option counts {missing}; add them to "
                                 "the model TOML's [temperature] values, e.g. "
                                 f'"{missing[0]}" = 1.0')
            self.temperatures = {int(b): float(t) for b, t in self.fixed_temperatures.items()}
            self.temperature_fits = {b: {"temperature": t, "status": "fixed", "reason": "given"}
                                     for b, t in self.temperatures.items()}
            return self.temperatures
        labelled = taskset.labels >= 0
        unlabelled = sorted(set(k.tolist()) - set(k[labelled].tolist()))
        temps, fits = {}, {}
        if len(unlabelled) < len(set(k.tolist())):
            keep = ~np.isin(k, unlabelled)
            logits = self.raw_logits(taskset, batches)
            for b, f in fits_by_bucket(logits[keep], taskset.option_mask[keep],
                                       taskset.labels[keep], calibration=True).items():
                temps[b], fits[b] = f.temperature, f.to_dict()
        if unlabelled:
            warnings.warn(f"the calibration split has no labels for option counts {unlabelled}: "
                          "their temperature is 1.0 (no scaling); give labels to fit them",
                          stacklevel=2)
            for b in unlabelled:
                temps[int(b)] = 1.0
                fits[int(b)] = {"temperature": 1.0, "status": "no_labels", "nll": None,
                                "n": int((k == b).sum()), "reason": "no labelled example"}
        self.temperatures = dict(sorted(temps.items()))
        self.temperature_fits = dict(sorted(fits.items()))
        return self.temperatures

    def temperature_of(self, taskset):
        """(N,) temperature of each question's option-count bucket."""
        k = taskset.n_options
        missing = sorted(set(k.tolist()) - set(self.temperatures))
        if missing:
            raise ValueError(f"no temperature for option counts {missing}: call calibrate() on "
                             "a calibration split that covers them")
        return np.array([self.temperatures[int(x)] for x in k], np.float32)

    def outputs(self, taskset, batches=None, progress=None):
        """All :class:`~runs.outputs.DecisionOutputs` for ``taskset`` (with ``exit_layer``
        when the module reports one, see :meth:`raw_logits`)."""
        logits = self.raw_logits(taskset, batches, progress)
        return finish_outputs(
            logits, taskset.option_mask, self.temperature_of(taskset), taskset.option_scores,
            taskset.action_map, ids=taskset.ids, task=taskset.task, labels=taskset.labels,
            human_dist=taskset.human_dist, exit_layer=self.last_exit_layer)
