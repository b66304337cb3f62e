"""The sweep: reference outputs once, then build, evaluate, check and time each variant.

Writes ``results/<run>/`` (see ../shared/DESIGN.md): run.json, reference/, one folder per variant
(outputs.npz, calibration_outputs.npz, build.json, timing.json, metrics.json, verdict.json),
summary.csv and report.md. Every file is written atomically; a rerun resumes: a variant whose
outputs and timing exist is not rebuilt, only its metrics and verdict are recomputed.
"""

import inspect
import json
import math
import zipfile
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

import mlx.core as mx
from mlx.utils import tree_flatten

from contracts.checker import load_contract
from contracts.report import render_report
from variants import BLAS_INFO, __version__, data
from variants.builders import get_family
from variants.check import check_calibration_size, check_strata, judge_variant, resolve_settings
from variants.builders.quantize import MODES
from variants.checkpoint import load_checkpoint
from variants.io import digest, write_json, write_text
from variants.models import MODELS, fitted_reference, get_module
from variants.outputs import DecisionOutputs
from variants.timing import TIMED_REGION, time_alternating

RESULTS_DIR = Path("results")
TIMING_BATCH_SIZES = (1, 32)


class SweepError(ValueError):
    """Bad sweep input; the message names the problem and the fix."""


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
    timing_rounds: int = 20
    timing_warmup: int = 1
    timing_budget_s: float = 20.0
    timing_batch_sizes: tuple = TIMING_BATCH_SIZES
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
            raise SweepError(f"unknown model {self.model!r}; choose one of: {', '.join(MODELS)}")
        try:
            family = get_family(self.family)
        except ValueError as e:
            raise SweepError(str(e)) from None
        unknown = sorted(set(self.params) - set(family.PARAMS))
        if unknown:
            raise SweepError(f"parameters {unknown} do not belong to family {self.family!r} "
                             f"(its parameters: {', '.join(family.PARAMS)})")
        for name, mode in (("quality_mode", self.quality_mode), ("speed_mode", self.speed_mode)):
            if mode not in MODES:
                raise SweepError(f"{name}={mode!r} is not supported; choose one of {MODES}")
        for name in ("n_fit", "n_calibration", "n_eval"):
            if getattr(self, name) < 10:
                raise SweepError(f"{name}={getattr(self, name)} is too small; use at least 10")
        if self.timing_rounds < 1 or self.timing_warmup < 0 or self.timing_budget_s <= 0:
            raise SweepError("timing_rounds must be >= 1, timing_warmup >= 0, timing_budget_s > 0")
        if not math.isfinite(self.timing_budget_s):
            raise SweepError("timing_budget_s must be a finite number of seconds, e.g. 20")
        if self.seed < 0:
            raise SweepError(f"seed={self.seed} must be >= 0")
        if self.batch_size < 1:
            raise SweepError(f"batch_size={self.batch_size} must be >= 1, e.g. --batch-size 32")
        if not (math.isfinite(self.near_tie_margin) and self.near_tie_margin > 0):
            raise SweepError(f"near_tie_margin={self.near_tie_margin} must be a finite number "
                             "> 0 (raw logits), e.g. --near-tie-margin 1.0")
        if self.run is not None and (not self.run or self.run.startswith(".")
                                     or "/" in self.run or "\\" in self.run):
            raise SweepError(f"run name {self.run!r} must be a plain folder name (no '/', not "
                             "empty, not starting with '.'), e.g. --run my-sweep")
        if not self.timing_batch_sizes or min(self.timing_batch_sizes) < 1:
            raise SweepError("timing_batch_sizes must be positive, e.g. --timing-batch-sizes 1 32")
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
        self.tasksets = {s: module.make_taskset(data.sample(data.split_frame(frame, s), n,
                                                            seed=cfg.seed))
                         for s, n in sizes.items()}
        settings = resolve_settings(self.contract, near_tie_margin=cfg.near_tie_margin)
        check_calibration_size(cfg.n_calibration, settings["alpha"])
        ev = self.tasksets["eval"]
        check_strata(self.contract, {"task": ev.task, "option_mask": ev.option_mask})
        if self.root.exists() and not self.root.is_dir():
            raise SweepError(f"--results-dir {self.root} is a file; pass a folder")
        self._check_run_folder()

    def _write_identity(self):
        """run.json holds the settings from the start, so an interrupted run resumes safely."""
        if not (self.out / "run.json").exists():
            write_json(self.out / "run.json", {"identity": self.cfg.identity(),
                                               "status": "running"})

    def _check_run_folder(self):
        run_json = self.out / "run.json"
        if run_json.exists():
            try:
                old = json.loads(run_json.read_text()).get("identity", {})
            except json.JSONDecodeError as e:
                raise SweepError(f"{run_json} is not valid JSON ({e}); delete {self.out} or "
                                 "choose another --run name") from None
            new = json.loads(json.dumps(self.cfg.identity()))
            diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
            if diff:
                raise SweepError(
                    f"{self.out} holds a sweep with other settings {diff} (old, new); "
                    f"choose another --run name or delete {self.out}")

    # -- reference --------------------------------------------------------------------------
    def reference(self):
        cfg = self.cfg
        self.ref_model, head_key = fitted_reference(cfg.model, self.checkpoint, self.tasksets,
                                                    self.cache, log=self.log)
        self.batches, self.truncated = {}, {}
        for split in ("calibration", "eval"):
            self.batches[split], self.truncated[split] = self.ref_model.prepare(
                self.tasksets[split], cfg.batch_size)
        self.ref_outputs = {}
        for split in ("calibration", "eval"):
            key = digest(self.checkpoint.sha256, "float32", self.tasksets[split].fingerprint(),
                         self.ref_model.config())
            path = self.cache / "reference" / f"{cfg.model}-{split}-{key}.npz"
            if path.exists():
                outputs = DecisionOutputs.load(path)
            else:
                outputs = self._outputs(self.ref_model, split, "reference")
                outputs.save(path)
            outputs.save(self.out / "reference" / f"{'outputs' if split == 'eval' else 'calibration_outputs'}.npz")
            self.ref_outputs[split] = outputs
        return self.ref_model

    def _outputs(self, model, split, what):
        ts = self.tasksets[split]
        with tqdm(total=len(ts), desc=f"{what} · {split}", unit="ex", leave=False,
                  disable=not self.cfg.progress) as bar:
            return model.outputs(ts, self.batches[split], progress=bar.update)

    # -- variants ---------------------------------------------------------------------------
    def _timing_batches(self):
        """B=1: the eval text of median token length; B=32: 32 eval texts drawn with the seed."""
        ts = self.tasksets["eval"]
        encs, _ = self.ref_model.tokenizer.encode(list(ts.texts))
        lengths = np.array([len(e.ids) for e in encs])
        median_idx = int(np.argsort(lengths, kind="stable")[len(lengths) // 2])
        out = {}
        for b in dict.fromkeys(self.cfg.timing_batch_sizes):
            rng = np.random.default_rng(self.cfg.seed)
            idx = (np.array([median_idx]) if b == 1
                   else np.sort(rng.choice(len(ts), min(b, len(ts)), replace=False)))
            batches, _ = self.ref_model.prepare(ts.subset(idx), batch_size=b)
            out[b] = batches[0]
        return out

    def _build_kwargs(self, family):
        """Optional keywords a family's build accepts (today: cache_dir for activation stats)."""
        params = inspect.signature(family.build).parameters
        kw = {"cache_dir": self.cache} if "cache_dir" in params else {}
        if "fit" in params:  # families that train something (early-exit heads)
            kw["fit"] = self.tasksets["fit"]
        return kw

    def _time_variant(self, family, vcfg, timing_batches):
        cfg = self.cfg
        var_model, _ = family.build(self.ref_model, vcfg, mode=cfg.speed_mode,
                                    calibration=self.tasksets["calibration"],
                                    **self._build_kwargs(family))
        result = {"timed_region": TIMED_REGION, "mode": cfg.speed_mode, "dtype": "float32",
                  "device": str(mx.default_device()), "blas": dict(BLAS_INFO), "batches": {}}
        for b, batch in timing_batches.items():
            r = time_alternating(lambda: self.ref_model.forward(batch),
                                 lambda: var_model.forward(batch), warmup=cfg.timing_warmup,
                                 rounds=cfg.timing_rounds, budget_s=cfg.timing_budget_s)
            r["batch_size"] = int(batch.input_ids.shape[0])
            r["seq_len"] = int(batch.input_ids.shape[1])
            result["batches"][str(b)] = r
        return result

    def variant(self, family, vcfg, timing_batches):
        """Build, run and time one variant unless its folder already holds the results."""
        cfg = self.cfg
        vdir = self.out / vcfg.name
        files = {n: vdir / n for n in ("outputs.npz", "calibration_outputs.npz", "build.json",
                                       "timing.json")}
        reusable = all(f.exists() for f in files.values()) and self._loadable(files)
        if reusable:
            self.log(f"{vcfg.name}: outputs and timing found, reusing them (resume)")
            self.reused.append(vcfg.name)
            timing = json.loads(files["timing.json"].read_text())
            missing = [b for b in dict.fromkeys(cfg.timing_batch_sizes)
                       if str(b) not in timing["batches"]]
            if missing:
                self.log(f"{vcfg.name}: timing batch sizes {missing} not measured yet; timing them")
                t1 = time.perf_counter()
                new = self._time_variant(family, vcfg,
                                         {b: timing_batches[b] for b in missing})
                timing["batches"].update(new["batches"])
                timing["wall_s"] = timing.get("wall_s", 0.0) + time.perf_counter() - t1
                write_json(files["timing.json"], timing)
        else:
            t0 = time.perf_counter()
            var_model, info = family.build(self.ref_model, vcfg, mode=cfg.quality_mode,
                                           calibration=self.tasksets["calibration"],
                                           **self._build_kwargs(family))
            info.update(config=asdict(vcfg), family=cfg.family, quality_mode=cfg.quality_mode,
                        speed_mode=cfg.speed_mode)
            outs = {split: self._outputs(var_model, split, vcfg.name)
                    for split in ("calibration", "eval")}
            info["quality_wall_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            timing = self._time_variant(family, vcfg, timing_batches)
            timing["wall_s"] = time.perf_counter() - t1
            outs["eval"].save(files["outputs.npz"])
            outs["calibration"].save(files["calibration_outputs.npz"])
            write_json(files["build.json"], info)
            write_json(files["timing.json"], timing)
        return self.judge(vcfg.name)

    def _loadable(self, files):
        """False (and a log line) when a saved file of a finished variant is corrupt."""
        try:
            for f in ("outputs.npz", "calibration_outputs.npz"):
                DecisionOutputs.load(files[f])
            for f in ("build.json", "timing.json"):
                json.loads(files[f].read_text())
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            self.log(f"{files['outputs.npz'].parent.name}: saved files unreadable "
                     f"({type(e).__name__}); rebuilding this variant")
            return False
        return True

    def judge(self, name):
        """Recompute metrics, verdict and the variant's own report from its saved outputs."""
        return judge_variant(self.out, name, self.contract, near_tie_margin=self.cfg.near_tie_margin)

    # -- the whole run ----------------------------------------------------------------------
    def run(self):
        cfg = self.cfg
        t0 = time.perf_counter()
        self.prepare()
        self.out.mkdir(parents=True, exist_ok=True)
        self._write_identity()
        self.reference()
        family = get_family(cfg.family)
        timing_batches = self._timing_batches()
        rows, details, extras = [], {}, {}
        for vcfg in tqdm(cfg.variants, desc="variants", unit="variant",
                         disable=not cfg.progress):
            row, ev, verdict = self.variant(family, vcfg, timing_batches)
            rows.append(row)
            details[vcfg.name] = (ev, verdict)
            if hasattr(family, "describe"):
                vdir = self.out / vcfg.name
                extras[vcfg.name] = family.describe(
                    json.loads((vdir / "build.json").read_text()),
                    json.loads((vdir / "timing.json").read_text()))
            self.log(f"{vcfg.name}: {'PASS' if verdict.passed else 'FAIL'}"
                     + (f" ({', '.join(verdict.failed)})" if verdict.failed else ""))
        summary = pd.DataFrame(rows)
        summary.to_csv(self.out / "summary.csv.tmp", index=False)
        (self.out / "summary.csv.tmp").replace(self.out / "summary.csv")
        meta = self.metadata(time.perf_counter() - t0)
        write_json(self.out / "run.json", meta)
        from variants.plots import plot_run, plots_markdown

        try:
            plot_paths = plot_run(self.out)
        except Exception as e:  # a plotting bug must not lose a finished sweep
            self.log(f"plots: not written ({type(e).__name__}: {e})")
            plot_paths = []
        write_text(self.out / "report.md", render_report(meta, summary, details, self.contract, extras)
                   + plots_markdown(plot_paths, self.out))
        return summary

    def metadata(self, wall_s):
        cfg = self.cfg
        d = asdict(cfg)
        d["variants"] = [v.name for v in cfg.variants]
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
            },
            "reference_model_bytes": int(sum(v.nbytes for _, v in
                                             tree_flatten(self.ref_model.module.parameters()))),
            "temperatures": {str(k): v for k, v in self.ref_model.temperatures.items()},
            "wall_s": wall_s,
            "reused_variants": self.reused,
        }


def run_sweep(log=print, **kwargs):
    """Validate ``kwargs`` (the fields of :class:`SweepConfig`) and run the sweep.

    Returns
    -------
    pandas.DataFrame
        summary.csv's table, one row per variant.

    Raises
    ------
    SweepError, contracts.checker.ContractError, variants.checkpoint.CheckpointError
        On bad input, before anything is written.
    """
    cfg = SweepConfig(**kwargs).validate()
    return Sweep(cfg, log=log).run()
