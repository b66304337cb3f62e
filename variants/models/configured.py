"""A decision model described by a model TOML (or a user's factory): :class:`ModelSource`.

The two bundled models are the shipped ``minilm-sentiment.toml`` and ``minilm-choice.toml`` next
to this file and go through the same path as a user's ``--model-config``. A source knows how to
turn the bundled VADER frame into a TaskSet (:meth:`ModelSource.make_taskset`) and how to build
its unfitted :class:`~variants.models.decision.DecisionModel` around a checkpoint
(:meth:`ModelSource.build`); it is plain data, so the cold-start child process can unpickle it.
"""

import importlib
from dataclasses import dataclass

import numpy as np

from metrics._checks import short_repr
from variants.models.model_config import ModelConfigError

#: early-exit head kind per logits kind (variants.families.exit.heads reproduces these two)
EXIT_HEAD_KINDS = {"linear-head": "linear", "cosine": "cosine", "classifier": "linear"}
#: the cosine scale the early-exit heads assume (variants.families.exit.heads.COSINE_SCALE)
EXIT_COSINE_SCALE = 20.0


def import_factory(spec, where="--model"):
    """The callable named by ``'package.module:callable'``.

    Raises
    ------
    ModelConfigError
        The module cannot be imported or has no such callable (names ``where`` and the fix).
    """
    mod_name, _, attr = str(spec).partition(":")
    if not mod_name or not attr:
        raise ModelConfigError(f"{where} {short_repr(spec)}: write 'package.module:factory' (a "
                               "module importable from here, and a callable in it)")
    try:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:  # a `variants` console script: cwd is not on sys.path
            import os
            import sys

            if e.name != mod_name.split(".")[0] or os.getcwd() in sys.path:
                raise
            sys.path.append(os.getcwd())
            mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or the user's module failing at import
        raise ModelConfigError(f"{where} {short_repr(spec)}: cannot import {mod_name!r} "
                               f"({type(e).__name__}: {e}); put its folder on PYTHONPATH or run "
                               "from it") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ModelConfigError(f"{where} {short_repr(spec)}: module {mod_name!r} has no callable "
                               f"{attr!r}; name a function that takes the Checkpoint and returns "
                               "a DecisionModel")
    return fn


@dataclass
class ModelSource:
    """What ``--model`` / ``--model-config`` names: a parsed TOML, a factory, or both.

    Attributes
    ----------
    name : str
        Run and cache file names.
    config : variants.models.model_config.ModelConfig or None
        None for a bare ``--model package.module:factory`` (its questions are minilm-sentiment's).
    factory : str or None
        ``'package.module:callable'``; called as ``factory(checkpoint)`` -> DecisionModel.
    options : list of str or None
        The options when neither the TOML nor the data gives them (a classifier's ``id2label``,
        set by :meth:`bind`).
    outputs : str
        What the model's logits are (:mod:`variants.models.head_output`): ``softmax`` (a choice
        among options: every kind but a checkpoint head that says otherwise), ``multi_label``
        or ``regression`` (a classifier checkpoint's config.json, read by :meth:`bind`).
    """

    name: str
    config: object = None
    factory: str | None = None
    options: list | None = None
    outputs: str = "softmax"

    def __str__(self):
        return self.name

    @property
    def kind(self):
        return None if self.config is None else self.config.logits

    @property
    def EXIT_HEAD_KIND(self):  # noqa: N802  (the name model files used)
        """'linear', 'cosine' or None (early exit cannot reproduce the model)."""
        if self.factory is not None or self.config is None:
            return None
        if self.kind == "cosine" and self.config.cosine_scale != EXIT_COSINE_SCALE:
            return None
        return EXIT_HEAD_KINDS.get(self.kind)

    def describe(self):
        """JSON-able record for run.json's ``model`` block (the parsed TOML, the factory; and
        ``outputs`` when they are not a softmax: what ``variants check`` judges them by)."""
        out = {"name": self.name, "factory": self.factory,
               "config": None if self.config is None else self.config.to_dict()}
        if self.outputs != "softmax":
            out["outputs"] = self.outputs
        return out

    # -- the questions ----------------------------------------------------------------------
    def bind(self, checkpoint):
        """Take what the TOML leaves to the checkpoint: a classifier's options (``id2label``).
        Raises ModelConfigError when a classifier checkpoint has no head or no labels."""
        cfg = self.config
        if cfg is None or cfg.logits != "classifier" or self.factory:
            return self
        head = getattr(checkpoint, "classifier", None)
        if head is None:
            raise ModelConfigError(
                f"{cfg.path}: logits = \"classifier\" but checkpoint {checkpoint.path} has no "
                "sequence-classification head; use logits = \"linear-head\" or a checkpoint with "
                "one")
        import mlx.core as mx

        from variants.models.head_output import REGRESSION, checkpoint_output_kind

        n_out = head(mx.zeros((1, 1, checkpoint.args.hidden_size)),
                     mx.ones((1, 1), dtype=mx.int32)).shape[-1]
        self.outputs = checkpoint_output_kind(checkpoint, n_out)  # ModelConfigError: refused
        labels = getattr(checkpoint, "id2label", None)
        if self.outputs == REGRESSION:
            labels = self._regression_labels(checkpoint, cfg, labels)
        if cfg.options is None:
            if not labels:
                raise ModelConfigError(f"{cfg.path}: options: checkpoint {checkpoint.path} has "
                                       "no id2label in config.json; list options = [...] here")
            self.options = list(labels)
        names = cfg.options if cfg.options is not None else self.options
        if len(names) != n_out:
            where = "options" if cfg.options is not None else \
                f"{checkpoint.path}/config.json id2label"
            raise ModelConfigError(f"{cfg.path}: options: {where} gives {len(names)} names but the "
                                   f"checkpoint's classifier head makes {n_out} logits; list "
                                   f"{n_out} options, one per logit in index order")
        return self

    @staticmethod
    def _regression_labels(checkpoint, cfg, labels):
        """The one name of a regression head's output (config.json's ``id2label``, or
        transformers' default ``LABEL_0`` when config.json says ``num_labels`` 1 without one).
        A regression head makes one output value and has no options, so config.json must say
        one label and the model TOML must not list several.

        Raises
        ------
        ModelConfigError
            One line naming config.json's ``id2label`` / ``num_labels`` (or the TOML's
            ``options``) and the fix.
        """
        from variants.models.head_output import read_config

        where = f"{checkpoint.path}/config.json"
        if cfg.options is not None:
            if len(cfg.options) != 1:
                raise ModelConfigError(
                    f"{cfg.path}: options: {len(cfg.options)} names for a regression head, which "
                    "makes one output value (no options: it is judged against the reference's "
                    "value); delete options from the model TOML")
            return labels
        if not labels:
            n = read_config(checkpoint.path).get("num_labels")
            if n == 1 and not isinstance(n, bool):
                return ["LABEL_0"]  # transformers' name for it
            said = "no num_labels (transformers reads 2)" if n is None else \
                f"num_labels {short_repr(n)}"
            raise ModelConfigError(
                f"{where}: a regression head (one output value) but config.json has no id2label "
                f"and {said}; set \"num_labels\": 1 (or \"id2label\": {{\"0\": \"LABEL_0\"}}) in "
                "config.json")
        if len(labels) != 1:
            raise ModelConfigError(
                f"{where}: id2label gives {len(labels)} names (transformers reads num_labels "
                f"{len(labels)}) but the "
                "regression head makes one output value; make id2label one entry "
                "(\"id2label\": {\"0\": \"LABEL_0\"}, num_labels 1) in config.json")
        return labels

    def fixed_options(self):
        """(options, scores, actions) of single-question models, or None."""
        cfg = self.config
        if cfg is None:  # a bare factory asks minilm-sentiment's question
            from variants.models.shipped import shipped_config

            cfg = shipped_config("minilm-sentiment")
        if cfg.options is not None:
            return cfg.options, cfg.scores, cfg.actions
        if self.options is not None:
            return self.options, None, None
        return None

    def action_names(self):
        if self.config is not None and self.config.action_names:
            return self.config.action_names
        opts = self.fixed_options()
        if opts is not None and opts[2] is None:
            return list(opts[0])
        from variants.models.shipped import shipped_config

        return shipped_config("minilm-sentiment").action_names

    def make_taskset(self, frame):
        """A TaskSet of the bundled VADER ``frame`` (columns id, text, mean_rating,
        rater_scores, domain).

        Fixed options are read as K ordered sentiment classes, negative first (K = 2, 3 or 5):
        label = the mean rating binned into K, raters binned alike (task ``sentiment-K``). With
        ``[tasks.NAME]`` tables each item asks one task, chosen by a stable hash of its id; a
        ``sentiment-K`` task is labelled as above, a ``domain-4`` task by the source corpus
        (options in the order tweet, movie, product, news). Without scores, scores are NaN;
        without actions, each option is its own action.

        Raises
        ------
        ModelConfigError
            The options cannot be labelled from VADER (pass your own data with ``--data``).
        """
        from variants.datasets import bundled as data
        from variants.datasets.tasks import build_taskset

        if self.outputs != "softmax":
            return self._unlabelled_taskset(frame)
        tasks = self.config.tasks if self.config is not None else None
        if tasks is None:
            fixed = self.fixed_options()
            if fixed is None:
                raise ModelConfigError(f"{self._where()}: options: the bundled VADER data has no "
                                       "per-row options; list options = [...] or pass --data")
            tasks = {f"sentiment-{len(fixed[0])}": dict(zip(("options", "scores", "actions"),
                                                             fixed))}
        names = list(tasks)
        for t, spec in tasks.items():
            k = len(spec["options"])
            ok = (t.startswith("sentiment") and k in data.SENTIMENT_BINS) or \
                 (t.startswith("domain") and k == len(data.DOMAINS))
            if not ok:
                raise ModelConfigError(
                    f"{self._where()}: task {t!r} with {k} options cannot be labelled from the "
                    "bundled VADER data (it has sentiment with 2, 3 or 5 ordered classes and "
                    f"{len(data.DOMAINS)} source domains); pass your own data with --data")
        if len(names) == 1:
            chosen = [names[0]] * len(frame)
        else:
            from runs.io import digest

            chosen = [names[int(digest("task", i), 16) % len(names)] for i in frame["id"]]
        rows = []
        means = frame["mean_rating"].to_numpy()
        for r, t, mean in zip(frame.itertuples(index=False), chosen, means):
            spec = tasks[t]
            opts = list(spec["options"])
            actions = list(spec["actions"]) if spec["actions"] is not None else opts
            scores = list(spec["scores"]) if spec["scores"] is not None else None
            if t.startswith("domain"):
                label, human = int(data.domain_label([r.domain])[0]), None
            else:
                k = len(opts)
                label = int(data.sentiment_label(np.array([mean]), k)[0])
                human = data.rater_distribution([r.rater_scores], k)[0].tolist()
            rows.append(dict(id=r.id, task=t, text=r.text, options=opts, scores=scores,
                             actions=actions, label=label, human=human))
        names_a = self.action_names()
        return build_taskset(rows, k_max=max(len(s["options"]) for s in tasks.values()),
                             action_names=names_a)

    def _unlabelled_taskset(self, frame):
        """The VADER texts as unlabelled rows of a multi-label or regression head (task
        ``outputs``, its labels as the options): it is judged against the reference's outputs,
        and VADER has no label sets or target values to read."""
        from variants.datasets.tasks import build_taskset

        opts = list(self.options)
        rows = [dict(id=r.id, task="outputs", text=r.text, options=opts, scores=None,
                     actions=opts, label=-1, human=None)
                for r in frame.itertuples(index=False)]
        return build_taskset(rows, k_max=len(opts), action_names=opts)

    def _where(self):
        return self.config.path if self.config is not None else f"--model {self.factory}"

    # -- the model --------------------------------------------------------------------------
    def build(self, checkpoint):
        """An unfitted DecisionModel around ``checkpoint`` (heads and temperatures are fitted by
        :func:`variants.models.fitted_reference`).

        Raises
        ------
        ModelConfigError
            A factory that cannot be imported or returns no DecisionModel; a classifier
            checkpoint without a head.
        """
        from variants.models.decision import DecisionModel

        cfg = self.config
        if self.factory:
            where = f"{cfg.path}: factory" if cfg is not None else "--model"
            factory = import_factory(self.factory, where)
            try:
                model = factory(checkpoint)
            except Exception as e:  # the user's code: one line, not a traceback
                raise ModelConfigError(
                    f"{where} {short_repr(self.factory)}: calling it raised {type(e).__name__}: "
                    f"{short_repr(str(e))}; fix the factory (called with the Checkpoint, it "
                    "returns a DecisionModel; see examples/own_model.py)") from None
            if not isinstance(model, DecisionModel):
                raise ModelConfigError(f"{where} {short_repr(self.factory)} returned "
                                       f"{type(model).__name__}, not a DecisionModel; return "
                                       "one (see examples/own_model.py)")
            if cfg is None:
                if not getattr(model, "name", None) or model.name == DecisionModel.name:
                    model.name = self.name
                return model
        elif cfg.logits == "linear-head":
            from variants.models import sentiment

            model = sentiment.build(checkpoint, n_classes=len(cfg.options))
            model.head_C = cfg.linear_head_C
        elif cfg.logits == "cosine":
            from variants.models import choice

            model = choice.build(checkpoint)
            model.scale = cfg.cosine_scale
        elif cfg.logits == "classifier":
            from variants.models import classifier

            self.bind(checkpoint)
            model = classifier.build(checkpoint, outputs=self.outputs)
        else:
            from variants.models import marker

            model = marker.build(checkpoint, cfg)
        model.name = cfg.name
        if cfg.prompt != "{text}" or cfg.logits == "marker":
            model.prompt, model.question = cfg.prompt, cfg.question
        if cfg.temperature_mode == "fixed":
            model.fixed_temperatures = dict(cfg.temperature_values)
        return model
