"""The sweep: reference outputs once, then build, evaluate, check and time each variant.

Writes ``results/<run>/`` (see ../shared/DESIGN.md): run.json, reference/, one folder per variant
(outputs.npz, calibration_outputs.npz, build.json, timing.json, metrics.json, verdict.json),
summary.csv and report.md. Every file is written atomically; a rerun resumes: a variant whose
outputs and timing exist is not rebuilt, only its metrics and verdict are recomputed (timing
fields an older run lacks, such as the end-to-end region or the cold start, are measured then).

The sweep also times itself (:class:`SweepClock`): reference forwards, variant builds, variant
forwards, timing, cold starts, metrics/contract/report, plots and the rest; the breakdown is
printed at the end and written to run.json (``sweep_time``).
"""

import inspect
import json
import math
import platform
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

import mlx.core as mx
from mlx.utils import tree_flatten

from contracts.checker import load_contract
from contracts.report import render_report
from variants import BLAS_INFO, __version__, data, parallel
from variants.builders import get_family
from variants.check import (check_calibration_size, check_strata, family_extras, judge_variant,
                            resolve_settings)
from variants.builders.quantize import MODES
from metrics._checks import short_repr
from variants.checkpoint import load_checkpoint
from variants import runlock
from variants.io import (RunIncomplete, WriteError, remove_temp_files, write_csv, write_json,
                         write_text)
from variants.models import MODELS, fitted_reference, get_module
from variants.outputs import DecisionOutputs
from variants.runfiles import CorruptFileError, read_build, read_outputs, read_run_json, read_timing
from variants.coldstart import measure_cold_start
from variants.timing import (DEFAULT_BUDGET_S, DEFAULT_MIN_ROUNDS, DEFAULT_ROUNDS, DEFAULT_WARMUP,
                             TIMED_REGIONS, end_to_end_call, split_regions, time_alternating)

RESULTS_DIR = Path("results")
TIMING_BATCH_SIZES = (1, 32)
#: Version of timing.json (1 = forward only, no schema_version key; 2 = + end_to_end, method,
#: model_bytes, cold_start). Documented in results/README.md.
TIMING_SCHEMA_VERSION = 2
COLD_START = ("none", "reference", "all")
#: Target share of a sweep's wall time spent outside model forwards (issue #6).
OUTSIDE_FORWARD_TARGET = 0.15


class SweepClock:
    """Wall time of a sweep by category (seconds), and counts of what it ran.

    Categories (``CATEGORIES``): ``setup`` (contract, checkpoint, data, tokenisation),
    ``reference_forward`` (reference head fit, temperatures and outputs, or loading them from the
    cache), ``variant_build``, ``variant_forward`` (variant outputs on calibration and eval),
    ``timing`` (alternated timing), ``cold_start`` (fresh-process measurements),
    ``metrics_contract_report`` (metrics, verdicts, reports, summary), ``plots``; ``other`` is
    the wall time none of them covers. ``FORWARD`` are the model-forward categories.
    """

    CATEGORIES = ("setup", "reference_forward", "variant_build", "variant_forward", "timing",
                  "cold_start", "metrics_contract_report", "plots")
    FORWARD = ("reference_forward", "variant_forward", "timing")

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds = dict.fromkeys(self.CATEGORIES, 0.0)
        self.counts = {"reference_output_batches": 0, "variant_output_batches": 0,
                       "variants_built": 0, "variants_reused": 0, "cold_starts": 0}
        self._open = None

    @contextmanager
    def __call__(self, category):
        """Add the block's wall time to ``category``. Raises ValueError on an unknown name or a
        nested block (a second would count the same seconds twice)."""
        if category not in self.seconds:
            raise ValueError(f"unknown sweep-time category {category!r}")
        if self._open is not None:
            raise ValueError(f"sweep clock: {category!r} nested inside {self._open!r}")
        self._open = category
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[category] += time.perf_counter() - t0
            self._open = None

    def breakdown(self):
        """{"wall_s", "seconds": {category: s, ..., "other": s}, "share": {...},
        "model_forward_s", "outside_forward_share", "target_outside_share", "counts"}."""
        wall = time.perf_counter() - self.start
        sec = dict(self.seconds)
        sec["other"] = max(0.0, wall - sum(sec.values()))
        fwd = sum(sec[c] for c in self.FORWARD)
        return {"wall_s": wall, "seconds": sec,
                "share": {k: (v / wall if wall > 0 else 0.0) for k, v in sec.items()},
                "model_forward_s": fwd,
                "outside_forward_share": (1.0 - fwd / wall) if wall > 0 else 0.0,
                "target_outside_share": OUTSIDE_FORWARD_TARGET,
                "forward_categories": list(self.FORWARD), "counts": dict(self.counts)}


def format_breakdown(b):
    """Lines of text for a :meth:`SweepClock.breakdown` (printed at the end of a sweep)."""
    lines = [f"sweep wall time {b['wall_s']:.1f} s:"]
    for k, v in b["seconds"].items():
        lines.append(f"  {k:<24} {v:8.1f} s  {b['share'][k]:6.1%}")
    share = b["outside_forward_share"]
    lines.append(f"  outside model forwards ({' + '.join(b['forward_categories'])} excluded): "
                 f"{share:.1%} (target <= {b['target_outside_share']:.0%})"
                 + ("" if share <= b["target_outside_share"] else " - above target"))
    c = b["counts"]
    lines.append(f"  reference output batches run: {c['reference_output_batches']}; variants "
                 f"built {c['variants_built']}, reused {c['variants_reused']}; cold starts "
                 f"{c['cold_starts']}")
    return lines


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
            msg = (f"every variant failed to build ({errors}); nothing but run.json was written "
                   f"to {out}")
        else:
            msg = (f"{len(self.failed)} variant(s) failed to build and were left out ({errors}); "
                   f"summary.csv and report.md in {out} cover the other {len(summary)}")
        super().__init__(msg)



@dataclass
class SweepConfig:
    """Everything that defines a sweep (CLI flags map one to one onto these fields)."""

    model: str = "minilm-sentiment"
    family: str = "quant"
    params: dict = field(default_factory=dict)  # the family's own parameters (its PARAMS)
    contract: str | None = None
    run: str | None = None
    results_dir: str = str(RESULTS_DIR)
    n_fit: int = 2000
    n_calibration: int = 800
    n_eval: int = 800
    quality_mode: str = "simulated"
    speed_mode: str = "native"
    timing_rounds: int = DEFAULT_ROUNDS
    timing_warmup: int = DEFAULT_WARMUP
    timing_budget_s: float = DEFAULT_BUDGET_S
    # None = DEFAULT_MIN_ROUNDS, or timing_rounds when fewer; an explicit value above
    # timing_rounds is refused by validate()
    timing_min_rounds: int | None = None
    timing_batch_sizes: tuple = TIMING_BATCH_SIZES
    cold_start: str = "all"
    near_tie_margin: float = 1.0
    batch_size: int = 32
    seed: int = 0
    progress: bool = True
    variants: list = field(default_factory=list)  # filled by validate()

    # fields whose change makes earlier outputs in the same run folder invalid
    # (a variant's folder name encodes its own parameters, so family parameters are not here)
    IDENTITY = ("model", "n_fit", "n_calibration", "n_eval", "quality_mode", "speed_mode", "seed",
                "batch_size")

    def validate(self):
        """Check every field; build the variant configs. Raises SweepError."""
        if self.model not in MODELS:
            raise SweepError(f"unknown model {short_repr(self.model)}; choose one of: "
                             f"{', '.join(MODELS)}")
        try:
            family = get_family(self.family)
        except ValueError as e:
            raise SweepError(str(e)) from None
        unknown = sorted(set(self.params) - set(family.PARAMS))
        if unknown:
            raise SweepError(f"parameters {short_repr(unknown)} do not belong to family "
                             f"{self.family!r} (its parameters: {', '.join(family.PARAMS)})")
        for name, mode in (("quality_mode", self.quality_mode), ("speed_mode", self.speed_mode)):
            if mode not in MODES:
                raise SweepError(f"{name}={short_repr(mode)} is not supported; choose one of "
                                 f"{MODES}")
        for name in ("n_fit", "n_calibration", "n_eval"):
            if getattr(self, name) < 10:
                raise SweepError(f"{name}={getattr(self, name)} is too small; use at least 10")
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
            self.timing_min_rounds = min(DEFAULT_MIN_ROUNDS, self.timing_rounds)
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
        if not (math.isfinite(self.near_tie_margin) and self.near_tie_margin > 0):
            raise SweepError(f"near_tie_margin={self.near_tie_margin} must be a finite number "
                             "> 0 (raw logits), e.g. --near-tie-margin 1.0")
        if self.run is not None and (not self.run or self.run.startswith(".")
                                     or "/" in self.run or "\\" in self.run):
            raise SweepError(f"run name {short_repr(self.run)} must be a plain folder name (no "
                             "'/', not empty, not starting with '.'), e.g. --run my-sweep")
        if self.run is not None and len(self.run.encode("utf-8", "surrogateescape")) > 255:
            raise SweepError(f"run name {short_repr(self.run)} is longer than a folder name may "
                             "be (255 bytes); pass a shorter --run")
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
        except ValueError as e:
            raise SweepError(str(e)) from None
        try:
            self.variants = family.ladder(**self.params)
        except ValueError as e:
            raise SweepError(str(e)) from None
        if self.run is None:
            self.run = f"{self.model}-{self.family}-{family.run_name(**self.params)}"
        return self

    def identity(self):
        return {k: getattr(self, k) for k in self.IDENTITY}


def _versions():
    import numpy
    import sklearn
    import tokenizers

    return {"mlx": mx.__version__, "numpy": numpy.__version__, "sklearn": sklearn.__version__,
            "tokenizers": tokenizers.__version__, "python": platform.python_version(),
            "mlx_variants": __version__, "platform": platform.platform()}


class Sweep:
    """Runs a validated :class:`SweepConfig`. ``log`` receives one-line progress messages."""

    def __init__(self, cfg, log=print):
        self.cfg = cfg
        self.log = log
        self.root = Path(cfg.results_dir)
        self.out = self.root / cfg.run
        self.cache = self.root / ".cache"
        self.reused = []

    # -- preparation ------------------------------------------------------------------------
    def prepare(self):
        """Load everything that can fail on bad input, before anything is written."""
        cfg = self.cfg
        self.contract = load_contract(cfg.contract)
        self.checkpoint = load_checkpoint()
        family = get_family(cfg.family)
        if hasattr(family, "check_model"):  # family checks that need the model's shapes
            try:
                extra = ({"model": cfg.model} if "model" in
                         inspect.signature(family.check_model).parameters else {})
                family.check_model(self.checkpoint.encoder, cfg.variants, **extra)
            except ValueError as e:
                raise SweepError(str(e)) from None
        frame = data.load_vader()
        module = get_module(cfg.model)
        sizes = {"fit": cfg.n_fit, "calibration": cfg.n_calibration, "eval": cfg.n_eval}
        splits = {s: data.split_frame(frame, s) for s in sizes}
        for s, n in sizes.items():  # a size beyond the split would be recorded but not used
            try:
                data.check_sample_size(splits[s], n, split=s, flag=f"--n-{s}")
            except ValueError as e:
                raise SweepError(str(e)) from None
        self.tasksets = {s: module.make_taskset(data.sample(splits[s], n, seed=cfg.seed))
                         for s, n in sizes.items()}
        settings = resolve_settings(self.contract, near_tie_margin=cfg.near_tie_margin)
        check_calibration_size(cfg.n_calibration, settings["alpha"])
        ev = self.tasksets["eval"]
        check_strata(self.contract, {"task": ev.task, "option_mask": ev.option_mask})
        if self.root.exists() and not self.root.is_dir():
            raise SweepError(f"--results-dir {self.root} is a file; pass a folder")
        self._check_run_folder()
        self._check_run_tokenizer()

    def _check_run_tokenizer(self):
        """A run folder whose run.json records other tokenizer settings (``data.tokenizer``, e.g.
        another max length) holds variant outputs of other token ids: refuse to resume it."""
        saved = _read_json(self.out / "run.json")
        old = saved.get("data", {}) if isinstance(saved, dict) else {}
        old = old.get("tokenizer") if isinstance(old, dict) else None
        new = self.checkpoint.tokenizer.settings()
        if isinstance(old, dict) and old.get("fingerprint") not in (None, new["fingerprint"]):
            diff = {k: (old.get(k), v) for k, v in json.loads(json.dumps(new)).items()
                    if old.get(k) != v}
            raise SweepError(f"{self.out} was swept with other tokenizer settings {diff} (old, "
                             f"new); choose another --run name or delete {self.out}")

    def _write_identity(self):
        """run.json holds the settings from the start, so an interrupted run resumes safely,
        and says "running" (a resumed run's earlier content is kept) until the run's end."""
        prev = self.previous_meta if isinstance(self.previous_meta, dict) else {}
        # the tokenizer settings from the start too: a run killed before its end and resumed
        # with other settings is refused (_check_run_tokenizer), not silently mixed
        data = prev.get("data") if isinstance(prev.get("data"), dict) else {}
        data = dict(data, tokenizer=self.checkpoint.tokenizer.settings())
        write_json(self.out / "run.json", dict(prev, identity=self.cfg.identity(), data=data,
                                               status="running"))

    def _check_run_folder(self):
        run_json = self.out / "run.json"
        if run_json.exists():
            old = read_run_json(run_json).get("identity", {})  # CorruptFileError: exit 2
            new = json.loads(json.dumps(self.cfg.identity()))
            diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
            if diff:
                raise SweepError(
                    f"{self.out} holds a sweep with other settings {diff} (old, new); "
                    f"choose another --run name or delete {self.out}")
        self._check_variant_folders()

    def _check_variant_folders(self):
        """A variant folder about to be resumed must hold the variant this sweep asks for, in
        files that are not corrupt.

        Every saved file the resume reads (outputs.npz, calibration_outputs.npz, build.json,
        timing.json) is read with its validating reader (:mod:`variants.runfiles`) here, before
        anything is written: a corrupt one raises CorruptFileError naming it (delete it and
        rerun; only that variant is rebuilt), outputs of another split size raise SweepError.
        Folder names encode a variant's parameters only approximately (an exit threshold of
        0.1234 and one of 0.1231 both give ``t0.123``), so the config its build.json recorded
        (``config``, the variant dataclass as built) is compared with the requested one. Fields
        only one side has (an older build.json, a field added since) are not compared.
        """
        for vcfg in self.cfg.variants:
            vdir = self.out / vcfg.name
            for f, split in (("outputs.npz", "eval"), ("calibration_outputs.npz", "calibration")):
                if (vdir / f).exists():
                    n, want = len(read_outputs(vdir / f)["ids"]), len(self.tasksets[split])
                    if n != want:
                        raise SweepError(f"{vdir / f} holds {n} {split} examples, this sweep "
                                         f"uses {want}; delete {vdir} or choose another --run")
            if (vdir / "timing.json").exists():
                read_timing(vdir / "timing.json")
            build_json = vdir / "build.json"
            if not build_json.exists():
                continue
            old = read_build(build_json).get("config")
            if not isinstance(old, dict):
                continue
            new = json.loads(json.dumps(asdict(vcfg)))
            diff = {k: (old[k], v) for k, v in new.items() if k in old and old[k] != v}
            if diff:
                fields = "; ".join(f"{k}: saved {short_repr(a)}, requested {short_repr(b)}"
                                   for k, (a, b) in diff.items())
                raise SweepError(
                    f"variant {vcfg.name}: {build_json} was built with other settings ({fields})"
                    f"; resuming would reuse the wrong variant. Choose another --run name or "
                    f"delete {build_json.parent}")

    # -- reference --------------------------------------------------------------------------
    def reference(self):
        """Fit (or load) the reference head and compute (or load) its outputs on both splits.

        With a warm cache nothing runs through the model: the head, temperatures and outputs
        come from ``results/.cache`` (``clock.counts["reference_output_batches"]`` stays 0).
        """
        cfg = self.cfg
        with self.clock("reference_forward"):
            self.ref_model, self.head_key = fitted_reference(cfg.model, self.checkpoint,
                                                             self.tasksets, self.cache,
                                                             log=self.log)
        self.batches, self.truncated = {}, {}
        with self.clock("setup"):
            for split in ("calibration", "eval"):
                self.batches[split], self.truncated[split] = self.ref_model.prepare(
                    self.tasksets[split], cfg.batch_size)
        self.ref_outputs = {}
        self.ref_outputs_cached = {}
        for split in ("calibration", "eval"):
            key = self.ref_model.cache_key(self.checkpoint.sha256, "float32",
                                           self.tasksets[split].fingerprint())
            path = self.cache / "reference" / f"{cfg.model}-{split}-{key}.npz"
            with self.clock("reference_forward"):
                self.ref_outputs_cached[split] = path.exists()
                if path.exists():
                    outputs = DecisionOutputs.load(path, "reference outputs cache file")
                else:
                    outputs = self._outputs(self.ref_model, split, "reference")
                    self.clock.counts["reference_output_batches"] += len(self.batches[split])
                    outputs.save(path)
            self.ref_outputs[split] = outputs
        return self.ref_model

    def save_reference(self):
        """Copy the reference's outputs (both splits, read or computed first) into the run."""
        for split, outputs in self.ref_outputs.items():
            name = "outputs" if split == "eval" else "calibration_outputs"
            outputs.save(self.out / "reference" / f"{name}.npz")

    def _outputs(self, model, split, what):
        ts = self.tasksets[split]
        with tqdm(total=len(ts), desc=f"{what} · {split}", unit="ex", leave=False,
                  disable=not self.cfg.progress) as bar:
            return model.outputs(ts, self.batches[split], progress=bar.update)

    # -- cold start ---------------------------------------------------------------------------
    def _cold_spec(self, timing_sets, family=None, vcfg=None):
        b = min(timing_sets)
        spec = {"model": self.cfg.model, "taskset": timing_sets[b][0],
                "head_path": str((self.cache / "heads" / f"{self.cfg.model}-{self.head_key}.npz")
                                 .resolve())}
        if vcfg is not None:
            params = inspect.signature(family.build).parameters
            spec.update(family=self.cfg.family, params=dict(self.cfg.params), variant=vcfg.name,
                        mode=self.cfg.speed_mode, calibration=self.tasksets["calibration"],
                        cache_dir=str(self.cache.resolve()),
                        fit=self.tasksets["fit"] if "fit" in params else None)
        return spec

    def _cold_start(self, spec, what):
        with self.clock("cold_start"):
            res = measure_cold_start(spec)
        self.clock.counts["cold_starts"] += 1
        if "error" in res:
            self.log(f"{what}: cold start not measured ({res['error']})")
        else:
            self.log(f"{what}: cold start {res['total_s']:.2f} s (import {res['import_s']:.2f}, "
                     f"weights {res['weight_load_s']:.2f}, build {res['build_s']:.2f}, first "
                     f"forward {res['first_forward_ms']:.0f} ms at B={res['batch_size']})")
        return res

    def reference_cold_start(self, timing_sets):
        """The reference's cold start (fresh process), reused from an earlier run.json."""
        if self.cfg.cold_start == "none":
            return None
        old = self.previous_meta.get("cold_start")
        if old and "error" not in old:
            return old
        return self._cold_start(self._cold_spec(timing_sets), "reference")

    # -- variants ---------------------------------------------------------------------------
    def _timing_batches(self):
        """{B: (TaskSet, seq_len)}. B=1: the eval text of median token length; B>1: B eval texts
        drawn with the seed. ``seq_len`` is the padded length of the prepared batch."""
        ts = self.tasksets["eval"]
        encs, _ = self.ref_model.tokenizer.encode(list(ts.texts))
        lengths = np.array([len(e.ids) for e in encs])
        median_idx = int(np.argsort(lengths, kind="stable")[len(lengths) // 2])
        out = {}
        for b in dict.fromkeys(self.cfg.timing_batch_sizes):
            rng = np.random.default_rng(self.cfg.seed)
            idx = (np.array([median_idx]) if b == 1
                   else np.sort(rng.choice(len(ts), min(b, len(ts)), replace=False)))
            sub = ts.subset(idx)
            batches, _ = self.ref_model.prepare(sub, batch_size=len(sub))
            out[b] = (sub, int(batches[0].input_ids.shape[1]))
        return out

    def _build_kwargs(self, family):
        """Optional keywords a family's build accepts (today: cache_dir for activation stats)."""
        params = inspect.signature(family.build).parameters
        kw = {"cache_dir": self.cache} if "cache_dir" in params else {}
        if "fit" in params:  # families that train something (early-exit heads)
            kw["fit"] = self.tasksets["fit"]
        return kw

    def _time_variant(self, family, vcfg, timing_sets):
        """timing.json content for ``timing_sets`` ({B: (TaskSet, seq_len)}): the variant is
        built in the speed mode, then per batch size one alternated measurement of end-to-end
        calls gives both regions (``batches`` = forward, ``end_to_end``)."""
        cfg = self.cfg
        with self.clock("variant_build"):
            var_model, _ = family.build(self.ref_model, vcfg, mode=cfg.speed_mode,
                                        calibration=self.tasksets["calibration"],
                                        **self._build_kwargs(family))
            mx.eval(var_model.module.parameters())
        result = {"schema_version": TIMING_SCHEMA_VERSION,
                  "timed_region": TIMED_REGIONS["forward"], "timed_regions": dict(TIMED_REGIONS),
                  "mode": cfg.speed_mode, "dtype": "float32",
                  "device": str(mx.default_device()), "blas": dict(BLAS_INFO),
                  "method": {"alternation": "strict: reference, variant per round",
                             "speedup": "median of per-round ratios ref_ms / var_ms, "
                                        "percentile-bootstrap 95% CI",
                             "warmup": cfg.timing_warmup, "rounds": cfg.timing_rounds,
                             "min_rounds": cfg.timing_min_rounds,
                             "budget_s_per_measurement": cfg.timing_budget_s,
                             "peak_memory": "mx.get_peak_memory, reset before every call"},
                  "model_bytes": {"reference": _model_bytes(self.ref_model),
                                  "variant": _model_bytes(var_model)},
                  "batches": {}, "end_to_end": {}}
        with self.clock("timing"):
            for b, (ts, seq_len) in timing_sets.items():
                r = time_alternating(end_to_end_call(self.ref_model, ts),
                                     end_to_end_call(var_model, ts), warmup=cfg.timing_warmup,
                                     rounds=cfg.timing_rounds, min_rounds=cfg.timing_min_rounds,
                                     budget_s=cfg.timing_budget_s)
                fwd, e2e = split_regions(r)
                for entry in (fwd, e2e):
                    entry["batch_size"] = len(ts)
                    entry["seq_len"] = seq_len
                result["batches"][str(b)] = fwd
                result["end_to_end"][str(b)] = e2e
        return result

    def variant(self, family, vcfg, timing_sets):
        """Build, run and time one variant unless its folder already holds the results."""
        cfg = self.cfg
        vdir = self.out / vcfg.name
        files = {n: vdir / n for n in ("outputs.npz", "calibration_outputs.npz", "build.json",
                                       "timing.json")}
        reusable = all(f.exists() for f in files.values())  # validated in prepare()
        if reusable:
            self.log(f"{vcfg.name}: outputs and timing found, reusing them (resume)")
            self.reused.append(vcfg.name)
            self.clock.counts["variants_reused"] += 1
            timing = read_timing(files["timing.json"])
            sizes = list(dict.fromkeys(cfg.timing_batch_sizes))
            missing = [b for b in sizes if str(b) not in timing.get("batches", {})
                       or str(b) not in timing.get("end_to_end", {})]
            changed = False
            if missing:
                self.log(f"{vcfg.name}: timing of batch sizes {missing} incomplete (forward or "
                         "end to end missing); timing them")
                t1 = time.perf_counter()
                new = self._time_variant(family, vcfg, {b: timing_sets[b] for b in missing})
                timing.setdefault("batches", {})
                timing.setdefault("end_to_end", {})
                for b in missing:
                    # keep an earlier forward measurement; add what is missing
                    timing["batches"].setdefault(str(b), new["batches"][str(b)])
                    timing["end_to_end"][str(b)] = new["end_to_end"][str(b)]
                for k in ("schema_version", "timed_regions", "method", "model_bytes"):
                    timing.setdefault(k, new[k])
                timing["wall_s"] = timing.get("wall_s", 0.0) + time.perf_counter() - t1
                changed = True
            if cfg.cold_start == "all" and "cold_start" not in timing:
                timing["cold_start"] = self._cold_start(
                    self._cold_spec(timing_sets, family, vcfg), vcfg.name)
                changed = True
            if changed:
                write_json(files["timing.json"], timing)
        else:
            try:
                return self._build_variant(family, vcfg, timing_sets, files)
            except CorruptFileError:  # a corrupt cache file: exit 2 naming it, nothing removed
                raise
            except ValueError:
                # nothing of a variant that failed stays behind (no half folder to resume)
                shutil.rmtree(vdir, ignore_errors=True)
                raise
        with self.clock("metrics_contract_report"):
            return self.judge(vcfg.name)

    def _build_variant(self, family, vcfg, timing_sets, files):
        """Build, run, time, save and judge one variant (no usable folder yet)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        with self.clock("variant_build"):
            var_model, info = family.build(self.ref_model, vcfg, mode=cfg.quality_mode,
                                           calibration=self.tasksets["calibration"],
                                           **self._build_kwargs(family))
        self.clock.counts["variants_built"] += 1
        info.update(config=asdict(vcfg), family=cfg.family, quality_mode=cfg.quality_mode,
                    speed_mode=cfg.speed_mode)
        with self.clock("variant_forward"):
            outs = {split: self._outputs(var_model, split, vcfg.name)
                    for split in ("calibration", "eval")}
        self.clock.counts["variant_output_batches"] += sum(
            len(self.batches[s]) for s in ("calibration", "eval"))
        info["quality_wall_s"] = time.perf_counter() - t0
        del var_model
        t1 = time.perf_counter()
        timing = self._time_variant(family, vcfg, timing_sets)
        timing["wall_s"] = time.perf_counter() - t1
        if cfg.cold_start == "all":
            timing["cold_start"] = self._cold_start(
                self._cold_spec(timing_sets, family, vcfg), vcfg.name)
        with self.clock("metrics_contract_report"):
            outs["eval"].save(files["outputs.npz"])
            outs["calibration"].save(files["calibration_outputs.npz"])
            write_json(files["build.json"], info)
            write_json(files["timing.json"], timing)
        with self.clock("metrics_contract_report"):
            return self.judge(vcfg.name)

    def judge(self, name):
        """Recompute metrics, verdict and the variant's own report from its saved outputs."""
        return judge_variant(self.out, name, self.contract, near_tie_margin=self.cfg.near_tie_margin)

    # -- the whole run ----------------------------------------------------------------------
    def run(self):
        """Run the sweep, holding the run folder's lock (:mod:`variants.runlock`) throughout.

        run.json says ``"running"`` from the first write into the run folder (after the
        reference's cache files were read and validated) until every output is in place (summary.csv,
        plots/, report.md); only then is its final status written: ``"complete"``, or
        ``"partial"``/``"failed"`` when variants failed to build. A write that fails (disk full,
        permission denied) leaves ``"incomplete"`` with ``error`` {file, error} and raises
        :class:`variants.io.WriteError`; a plotting bug leaves ``"incomplete"`` too (summary.csv
        and report.md, without plots, are written) and raises :class:`RunIncomplete`. Rerunning
        the same command finishes such a run. On start, temp files a killed writer left in the
        run folder (and in the cache, when no other sweep uses it) are removed.
        """
        self.clock = SweepClock()
        with self.clock("setup"):
            self.prepare()
            self.out.mkdir(parents=True, exist_ok=True)
        with runlock.hold(self.out, log=self.log), \
                runlock.cache_lock(self.cache, when_alone=self._clean_cache):
            try:
                return self._run_locked()
            except (WriteError, RunIncomplete) as e:
                self._mark_incomplete(e)
                raise

    def _clean_cache(self):
        removed = remove_temp_files(self.cache)
        if removed:
            self.log(f"{self.cache}: removed {len(removed)} leftover temp file(s) of a killed "
                     "writer")

    def _mark_incomplete(self, error):
        """run.json: status "incomplete" and the error (best effort: the disk may be full)."""
        file = getattr(error, "filename", None) or getattr(error, "file", None)
        meta = _read_json(self.out / "run.json")
        meta = meta if isinstance(meta, dict) else {}
        meta.update(identity=self.cfg.identity(), status="incomplete",
                    error={"file": str(file) if file else None, "error": str(error)})
        try:
            write_json(self.out / "run.json", meta)
        except OSError as e:
            self.log(f"run.json: cannot record the error either ({e})")

    def _run_locked(self):
        cfg = self.cfg
        with self.clock("setup"):
            self._check_run_folder()  # again, under the lock: another sweep may have written
            removed = remove_temp_files(self.out)
            if removed:
                self.log(f"{self.out}: removed {len(removed)} leftover temp file(s) of a killed "
                         "writer")
            self.previous_meta = _read_json(self.out / "run.json")
        # the reference's cache files are read (and validated) before the run folder changes:
        # a corrupt cache file stops the sweep with nothing in the folder rewritten
        self.reference()
        with self.clock("setup"):
            self._write_identity()
            self.save_reference()
        family = get_family(cfg.family)
        with self.clock("setup"):
            timing_sets = self._timing_batches()
        self.cold_start = self.reference_cold_start(timing_sets)
        rows, details, extras = [], {}, {}
        self.failed = {}
        for vcfg in tqdm(cfg.variants, desc="variants", unit="variant",
                         disable=not cfg.progress):
            try:
                row, ev, verdict = self.variant(family, vcfg, timing_sets)
            except CorruptFileError:  # not this variant's failure: the whole sweep stops
                raise
            except ValueError as e:
                # this variant only (e.g. a fixed exit threshold that fires on no calibration
                # example, detectable at build time alone): log it, go on with the others
                self.failed[vcfg.name] = f"{type(e).__name__}: {e}"
                self.log(f"{vcfg.name}: FAILED, left out ({self.failed[vcfg.name]}); continuing "
                         "with the other variants")
                continue
            rows.append(row)
            details[vcfg.name] = (ev, verdict)
            with self.clock("metrics_contract_report"):
                extras.update(family_extras(self.out, cfg.family, [vcfg.name], family=family))
            self.log(f"{vcfg.name}: {'PASS' if verdict.passed else 'FAIL'}"
                     + (f" ({', '.join(verdict.failed)})" if verdict.failed else ""))
        self.extras = extras
        if not rows:
            meta = self.metadata()
            write_json(self.out / "run.json", meta)
            raise VariantsFailed(self.failed, None, self.out)
        with self.clock("metrics_contract_report"):
            summary = pd.DataFrame(rows)
            write_csv(self.out / "summary.csv", summary)
            # the plots read run.json; its status stays "running" until report.md is written
            write_json(self.out / "run.json", dict(self.metadata(), status="running"))
        from variants.plots import plot_run, plots_markdown

        plot_error = None
        with self.clock("plots"):
            try:
                # the judge's evaluations: the plots do not evaluate the variants again
                plot_paths = plot_run(self.out, evaluations={n: ev for n, (ev, _) in details.items()})
            except WriteError:
                raise
            except Exception as e:  # a plotting bug: report.md is still written, without plots
                plot_error = RunIncomplete(self.out / "plots", f"{type(e).__name__}: {e}")
                self.log(f"plots: not written ({type(e).__name__}: {e})")
                plot_paths = []
        with self.clock("metrics_contract_report"):
            # the final status as the report shows it; run.json gets it only after report.md
            meta = self.metadata()  # the breakdown now includes the plots
            write_text(self.out / "report.md",
                       render_report(meta, summary, details, self.contract, extras)
                       + plots_markdown(plot_paths, self.out))
        if plot_error is not None:
            raise plot_error
        meta = self.metadata()  # the final status, written last
        write_json(self.out / "run.json", meta)
        self.breakdown = meta["sweep_time"]
        for line in format_breakdown(self.breakdown):
            self.log(line)
        if self.failed:
            raise VariantsFailed(self.failed, summary, self.out)
        return summary

    def metadata(self):
        cfg = self.cfg
        d = asdict(cfg)
        d["variants"] = [v.name for v in cfg.variants]
        breakdown = self.clock.breakdown()
        failed = dict(getattr(self, "failed", {}))
        return {
            "identity": cfg.identity(),
            "config": d,
            "contract": self.contract.name,
            "versions": _versions(),
            "blas": dict(BLAS_INFO),
            "device": str(mx.default_device()),
            "dtype": "float32",
            "checkpoint": {"path": str(self.checkpoint.path), "sha256": self.checkpoint.sha256},
            "data": {
                "source": "VADER ICWSM 2014 ground truth (data/vader, MIT)",
                "splits": {s: {"n": len(ts), "fingerprint": ts.fingerprint()}
                           for s, ts in self.tasksets.items()},
                "truncated_texts": self.truncated,
                "max_tokens": self.checkpoint.tokenizer.max_length,
                "tokenizer": self.checkpoint.tokenizer.settings(),
            },
            "reference_model_bytes": _model_bytes(self.ref_model),
            "temperatures": {str(k): v for k, v in self.ref_model.temperatures.items()},
            "temperature_fits": {str(k): v for k, v in getattr(self.ref_model, "temperature_fits", {}).items()},
            "wall_s": breakdown["wall_s"],
            "reused_variants": self.reused,
            "reference_outputs_from_cache": dict(self.ref_outputs_cached),
            "cold_start": self.cold_start,
            "parallel": parallel.info(),
            "status": ("complete" if not failed else
                       "partial" if len(failed) < len(cfg.variants) else "failed"),
            "failed_variants": failed,
            "extras": dict(getattr(self, "extras", {})),
            "sweep_time": breakdown,
        }


def _model_bytes(model):
    """Bytes of a DecisionModel's parameters as stored (quantized layers: packed weights +
    scales + biases; fp32 elsewhere)."""
    return int(sum(v.nbytes for _, v in tree_flatten(model.module.parameters())))


def _read_json(path):
    """run.json as a dict; {} when missing (CorruptFileError when corrupt, see prepare())."""
    from runs.folder import RunFolder  # the one reader of a run folder

    return RunFolder(Path(path).parent).meta


def run_sweep(log=print, **kwargs):
    """Validate ``kwargs`` (the fields of :class:`SweepConfig`) and run the sweep.

    Returns
    -------
    pandas.DataFrame
        summary.csv's table, one row per variant.

    Raises
    ------
    SweepError, contracts.checker.ContractError, variants.checkpoint.CheckpointError
        On bad input, before anything is written (a variant folder of this run that was built
        with other settings is bad input too).
    VariantsFailed
        At the end, when a variant's build raised ValueError: the other variants were written
        (``summary`` attribute; None when none succeeded), run.json lists the failures.
    """
    cfg = SweepConfig(**kwargs).validate()
    return Sweep(cfg, log=log).run()
