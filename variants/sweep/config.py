"""What defines a sweep (:class:`SweepConfig`, one field per ``variants sweep`` flag), its
validation (one pass, :meth:`SweepConfig.validate`, building the variant ladder) and the sweep's
input errors."""

import math
from metrics.defaults import NEAR_TIE_MARGIN
from dataclasses import dataclass, field
from pathlib import Path

from metrics._checks import short_repr
from runs.names import control_problem, name_problem
from variants import defaults
from variants.runtime import device, env, parallel
from variants.families import get_family
from variants.families.quant.family import MODES
from variants.models import resolve

RESULTS_DIR = Path(defaults.RESULTS_DIR)
TIMING_BATCH_SIZES = defaults.TIMING_BATCH_SIZES
COLD_START = defaults.COLD_STARTS
#: the smallest split size (fit, calibration, eval); --n-fit may also be 0 for a model that
#: fits nothing
MIN_FIT = 10


class SweepError(ValueError):
    """Bad sweep input; the message names the problem and the fix."""


class VariantsFailed(SweepError):
    """Raised at the end of a sweep in which some (or all) variants failed to build.

    The others were built, judged and written (``summary`` is their summary.csv table, None
    when none succeeded); run.json records ``status`` ("partial" or "failed") and
    ``failed_variants`` {name: error}.
    """

    def __init__(self, failed, summary, out):
        self.failed, self.summary, self.out = dict(failed), summary, out
        errors = "; ".join(f"{n}: {e}" for n, e in self.failed.items())
        if summary is None:
            msg = (f"every variant failed to build ({errors}); no variant was written (only "
                   f"run.json and the reference's outputs, in {out})")
        else:
            msg = (f"{len(self.failed)} variant(s) failed to build and were left out ({errors}); "
                   f"summary.csv and report.md in {out} cover the other {len(summary)}")
        super().__init__(msg)


@dataclass
class SweepConfig:
    """Everything that defines a sweep (CLI flags map one to one onto these fields)."""

    model: str | None = None  # a registered name or package.module:factory; None = default
    model_config: str | None = None  # --model-config: a model TOML file
    checkpoint: str | None = None  # --checkpoint: overrides the TOML's (None = TOML's or MiniLM)
    data: str | None = None  # --data: the user's JSONL / CSV / Parquet (None = bundled VADER)
    # --max-length: tokens per text; None = the model TOML's max_length, else the tokenizer's
    max_length: int | None = defaults.MAX_LENGTH
    family: str = "quant"
    params: dict = field(default_factory=dict)  # the family's own parameters (its PARAMS)
    contract: str | None = None
    run: str | None = None
    results_dir: str = str(RESULTS_DIR)
    n_fit: int = defaults.N_FIT
    n_calibration: int = defaults.N_CALIBRATION
    n_eval: int = defaults.N_EVAL
    quality_mode: str = "simulated"
    speed_mode: str = "native"
    timing_rounds: int = defaults.TIMING_ROUNDS
    timing_warmup: int = defaults.TIMING_WARMUP
    timing_budget_s: float = defaults.TIMING_BUDGET_S
    # None = defaults.TIMING_MIN_ROUNDS, or timing_rounds when fewer; an explicit value above
    # timing_rounds is refused by validate()
    timing_min_rounds: int | None = None
    timing_batch_sizes: tuple = TIMING_BATCH_SIZES
    cold_start: str = defaults.COLD_START
    near_tie_margin: float = NEAR_TIE_MARGIN
    batch_size: int = 32
    seed: int = defaults.SEED
    progress: bool = True
    device: str | None = None  # --device cpu|gpu; None = $VARIANTS_DEVICE, else cpu (validate)
    dtype: str = "float32"  # --dtype; float16/bfloat16 only on a GPU (variants.runtime.device.check)
    variants: list = field(default_factory=list)  # filled by validate()
    #: what the files named above hold (parsed model TOML, checkpoint sha256, data fingerprint),
    #: filled by variants.sweep.inputs.load_inputs; part of :meth:`identity`
    inputs_identity: dict = field(default_factory=dict)

    # fields whose change makes earlier outputs in the same run folder invalid
    # (a variant's folder name encodes its own parameters, so family parameters are not here)
    IDENTITY = ("model", "n_fit", "n_calibration", "n_eval", "quality_mode", "speed_mode", "seed",
                "batch_size", "model_config", "checkpoint", "data", "device", "dtype")
    DEFAULT_MODEL = "minilm-sentiment"

    def validate(self):
        """Check every field; build the variant configs. Raises SweepError."""
        self.resolve_model()
        try:
            family = get_family(self.family)
        except ValueError as e:
            raise SweepError(str(e)) from None
        unknown = sorted(set(self.params) - set(family.params))
        if unknown:
            raise SweepError(f"parameters {short_repr(unknown)} do not belong to family "
                             f"{self.family!r} (its parameters: {', '.join(family.params)})")
        for name, mode in (("quality_mode", self.quality_mode), ("speed_mode", self.speed_mode)):
            if mode not in MODES:
                raise SweepError(f"{name}={short_repr(mode)} is not supported; choose one of "
                                 f"{MODES}")
        for name in ("n_fit", "n_calibration", "n_eval"):
            if getattr(self, name) < MIN_FIT and not (name == "n_fit" and self.n_fit == 0):
                flag = "--" + name.replace("_", "-")
                raise SweepError(f"{flag} {getattr(self, name)} is too small; pass {flag} "
                                 f"{MIN_FIT} or more" + (" (or 0 for a model that fits nothing)"
                                                         if name == "n_fit" else ""))
        if self.max_length is not None:
            from variants.models.model_config import check_max_length

            try:
                check_max_length(self.max_length, "--max-length")
            except ValueError as e:
                raise SweepError(str(e)) from None
        if self.timing_rounds < 1:
            raise SweepError(f"timing_rounds={self.timing_rounds} (--timing-rounds) must be >= 1, "
                             "e.g. --timing-rounds 50")
        if self.timing_warmup < 0:
            raise SweepError(f"timing_warmup={self.timing_warmup} (--timing-warmup) must be >= 0, "
                             "e.g. --timing-warmup 5")
        if not (math.isfinite(self.timing_budget_s) and self.timing_budget_s > 0):
            raise SweepError(f"timing_budget_s={self.timing_budget_s:g} (--timing-budget-s) must "
                             "be a finite number of seconds > 0, e.g. --timing-budget-s 20")
        if self.timing_min_rounds is None:
            self.timing_min_rounds = min(defaults.TIMING_MIN_ROUNDS, self.timing_rounds)
        if self.timing_min_rounds < 1:
            raise SweepError(f"timing_min_rounds={self.timing_min_rounds} must be >= 1, "
                             "e.g. --timing-min-rounds 3")
        if self.timing_min_rounds > self.timing_rounds:
            raise SweepError(f"timing_min_rounds={self.timing_min_rounds} (--timing-min-rounds) "
                             f"exceeds timing_rounds={self.timing_rounds} (--timing-rounds): "
                             "the minimum cannot be above the rounds requested; lower "
                             "--timing-min-rounds or raise --timing-rounds")
        if self.cold_start not in COLD_START:
            raise SweepError(f"cold_start={short_repr(self.cold_start)}; choose one of "
                             f"{COLD_START}")
        if self.seed < 0:
            raise SweepError(f"seed={self.seed} must be >= 0")
        if self.batch_size < 1:
            raise SweepError(f"batch_size={self.batch_size} must be >= 1, e.g. --batch-size 32")
        from contracts.contract import MAX_NEAR_TIE_MARGIN

        if not (math.isfinite(self.near_tie_margin)
                and 0 < self.near_tie_margin <= MAX_NEAR_TIE_MARGIN):
            raise SweepError(f"--near-tie-margin {self.near_tie_margin} must be a number in "
                             f"(0, {MAX_NEAR_TIE_MARGIN:g}] (raw logits), e.g. "
                             "--near-tie-margin 1.0")
        if not str(self.results_dir).strip():  # Path("") is the current folder
            raise SweepError("--results-dir is empty; pass a folder")
        if control_problem(self.results_dir):
            raise SweepError(f"--results-dir {short_repr(str(self.results_dir))} "
                             f"{control_problem(self.results_dir)}; pass a plain path")
        why = None if self.run is None else name_problem(self.run, csv=True)
        if why:
            raise SweepError(f"run name {short_repr(self.run)} must be a plain folder name: it "
                             f"{why}; pass e.g. --run my-sweep")
        if not self.timing_batch_sizes or min(self.timing_batch_sizes) < 1:
            raise SweepError("timing_batch_sizes must be positive, e.g. --timing-batch-sizes 1 32")
        too_big = sorted({b for b in self.timing_batch_sizes if b > self.n_eval})
        if too_big:
            raise SweepError(
                f"--timing-batch-sizes {' '.join(map(str, too_big))} exceed the eval set "
                f"(--n-eval {self.n_eval}): a timed batch is drawn from the eval texts, so it "
                f"would hold only {self.n_eval}; pass batch sizes <= {self.n_eval} or raise "
                "--n-eval")
        try:
            parallel.validate_env()
            env.check()  # every closed-set VARIANTS_* variable (variants.runtime.env)
            self.device = device.requested(self.device)
            device.check(self.device, self.dtype)
        except ValueError as e:
            raise SweepError(str(e)) from None
        toml_map = getattr(self._source.config, "quant_bits_map", "")
        if self.family == "quant" and toml_map and not self.params.get("bits_map"):
            self.params["bits_map"] = toml_map  # the model TOML's [quant] bits_map
        toml_method = getattr(self._source.config, "quant_method", ())
        if self.family == "quant" and toml_method and not self.params.get("quant_method"):
            self.params["quant_method"] = list(toml_method)  # the model TOML's [quant] method
        for key in ("scale_dtype", "mode"):  # the model TOML's [quant] scale_dtype / mode
            toml_v = getattr(self._source.config, f"quant_{key}", "")
            param = "quant_mode" if key == "mode" else key
            if self.family == "quant" and toml_v and self.params.get(param) is None:
                self.params[param] = toml_v
        toml_rmap = getattr(self._source.config, "lowrank_ratio_map", "")
        if self.family == "lowrank" and toml_rmap and not self.params.get("ratio_map"):
            self.params["ratio_map"] = toml_rmap  # the model TOML's [lowrank] ratio_map
        try:
            self.variants = family.ladder(**self.params)
        except ValueError as e:
            raise SweepError(str(e)) from None
        for v in self.variants:  # summary.csv keys: a name pandas reads as NaN is a bug here
            if name_problem(v.name, csv=True):
                raise SweepError(f"variant name {short_repr(v.name)} "
                                 f"{name_problem(v.name, csv=True)}; report this as a bug")
        if (family.judged_in_speed_mode is not None and self.variants
                and all(family.judged_in_speed_mode(v) for v in self.variants)):
            # every variant is judged on the model it times (W8A8: variants.families.family),
            # so the run's quality mode is the speed mode: run.json, the reports and the
            # run's identity say so (a folder judged otherwise is not resumed)
            if self.quality_mode != self.speed_mode:  # said once by the sweep (Sweep.prepare)
                self._quality_asked = self.quality_mode
            self.quality_mode = self.speed_mode
            self._quality_follows_speed = True
        if self.run is None:
            self.run = f"{self.model}-{self.family}-{family.run_name(**self.params)}"
        return self

    def resolve_model(self):
        """The :class:`~variants.models.configured.ModelSource` of ``model`` / ``model_config``
        (parsed once); sets ``model`` to its name. Raises SweepError (bad TOML, unknown name,
        a factory that does not import, both flags given)."""
        source = getattr(self, "_source", None)
        if source is not None:
            return source
        if self.model_config is not None and not str(self.model_config).strip():
            raise SweepError("--model-config is empty; give a path, or leave the flag out")
        if self.model is not None and not str(self.model).strip():  # not the default model
            raise SweepError("--model is empty; give a bundled model's name or "
                             "package.module:factory, or leave the flag out")
        if self.model_config is not None:
            try:
                source = resolve(model_config=self.model_config)
            except ValueError as e:
                raise SweepError(str(e)) from None
            if self.model is not None and self.model != source.name:
                raise SweepError(f"--model {short_repr(self.model)} and --model-config "
                                 f"{self.model_config} both name the model; pass one of them "
                                 "(a TOML's own code goes in its factory = key)")
        else:
            try:
                source = resolve(model=self.model or self.DEFAULT_MODEL)
            except ValueError as e:
                raise SweepError(str(e)) from None
        for flag, value in (("--checkpoint", self.checkpoint), ("--data", self.data)):
            if value is not None and not str(value).strip():
                raise SweepError(f"{flag} is empty; give a path, or leave the flag out")
            if value is not None and not Path(value).exists():
                raise SweepError(f"{flag} {short_repr(value)}: no such "
                                 f"{'folder' if flag == '--checkpoint' else 'file'}; check the "
                                 "path")
        self.model = source.name
        self._source = source
        return source

    def max_length_choice(self):
        """(tokens, where set) of the user's max length: ``--max-length``, else the model TOML's
        ``max_length``; None when neither is given (the tokenizer files decide)."""
        if self.max_length is not None:
            return int(self.max_length), "--max-length"
        toml = getattr(self.resolve_model().config, "max_length", None)
        if toml is not None:
            return int(toml), f"model TOML max_length ({self.resolve_model().config.path})"
        return None

    def identity(self):
        """What must match to resume a run folder: the IDENTITY fields, plus what the model
        TOML, checkpoint and data file held (``inputs_identity``) when any was given."""
        out = {k: getattr(self, k) for k in self.IDENTITY}
        out.update(self.inputs_identity)
        return out
