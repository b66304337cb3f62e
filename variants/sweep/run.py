"""The sweep: reference outputs once, then build, evaluate, check and time each variant.

Writes ``results/<run>/`` (results/README.md). Every file is written atomically; a rerun
resumes: a variant whose outputs and timing exist is not rebuilt, only judged again (timing
fields an older run lacks are measured then).

Its parts: config (``sweep_config``), inputs (``sweep_inputs``), resume checks and a resumed
variant's missing timing (``sweep_resume``), timing (``sweep_timing``), its own time
(``sweep_clock``), run.json (``sweep_meta``), all in :mod:`variants`; this module is the run loop.
"""

from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from runs import lock as runlock
from variants.runtime import device
from runs.family_text import family_extras
from runs.io import (RunIncomplete, WriteError, missing_folders, remove_empty_folders,
                     remove_temp_files, write_csv, write_json, write_npz, write_text)
from runs.judge import judge_variant
from runs.readers import CorruptFileError
from runs.report import render_report
from variants.families import get_family
from variants.sweep.coldstart import measure_cold_start
from variants.sweep.ref_profile import reference_profile
from variants.models import fitted_state
from variants.sweep.clock import SweepClock, format_breakdown
from variants.sweep.config import SweepConfig, SweepError, VariantsFailed
from variants.sweep.meta import run_metadata
from variants.sweep.reference import ReferenceNotFinite, prepare_reference
from variants.sweep.resume import (check_reference_fit, check_run_folder, check_run_tokenizer,
                                   read_json)
from variants.sweep.inputs import load_inputs
from variants.sweep.variant_steps import VariantSteps
from variants.sweep.quality import premeasure
from variants.sweep.timing import cold_start_spec, timing_batches


class Sweep(VariantSteps):
    """Runs a validated :class:`SweepConfig`. ``log`` receives one-line progress messages."""

    def __init__(self, cfg, log=print, executor=None):
        self.cfg, self.log, self.executor = cfg, log, executor  # quality passes: sweep.quality
        self.root = Path(cfg.results_dir)
        self.out = self.root / cfg.run
        self.cache = self.root / ".cache"
        self.reused = []
        self.wrote_running = False  # set once this sweep has written run.json "running"

    # -- preparation ------------------------------------------------------------------------
    def prepare(self):
        """Load everything that can fail on bad input, before anything is written."""
        device.use(self.cfg.device or device.requested(), self.cfg.dtype)  # once, at the start
        self.contract, self.checkpoint, self.tasksets = load_inputs(self.cfg)
        if self.root.exists() and not self.root.is_dir():
            raise SweepError(f"--results-dir {self.root} is a file; pass a folder")
        self._check_run_folder()
        self._check_run_tokenizer()
        asked = getattr(self.cfg, "_quality_asked", None)
        if asked:  # after the checks: a refused sweep says one line
            self.log(f"quality judged in {self.cfg.speed_mode} mode, not {asked}: every variant "
                     "here has W8A8 Linears, judged on the model that runs (--speed-mode)")

    def _check_run_folder(self):
        check_run_folder(self.out, self.cfg, self.tasksets)

    def _check_run_tokenizer(self):
        check_run_tokenizer(self.out, self.checkpoint.tokenizer.settings())

    def _write_identity(self):
        """run.json holds the settings from the start, so an interrupted run resumes safely,
        and says "running" (a resumed run's earlier content is kept) until the run's end."""
        prev = self.previous_meta if isinstance(self.previous_meta, dict) else {}
        # the tokenizer settings from the start too: a run killed before its end and resumed
        # with other settings is refused (_check_run_tokenizer), not silently mixed
        data = prev.get("data") if isinstance(prev.get("data"), dict) else {}
        data = dict(data, tokenizer=self.checkpoint.tokenizer.settings())
        # the reference's numerical noise from the start too: the judge reads it there
        write_json(self.out / "run.json", dict(prev, identity=self.cfg.identity(), data=data,
                                               reference_noise=self.ref_noise, status="running"))
        self.wrote_running = True  # from now on an exception marks the run "incomplete"

    # -- reference --------------------------------------------------------------------------
    def reference(self):
        """Fit (or load) the reference head and compute (or load) its outputs on both splits,
        and measure its numerical noise (:func:`variants.sweep.reference.prepare_reference`)."""
        return prepare_reference(self)

    def save_reference(self):
        """Copy the reference's outputs (both splits, read or computed first) and its fitted
        head and temperatures (``reference/fitted.npz``, hashed in run.json's
        ``reference_fit``) into the run."""
        for split, outputs in self.ref_outputs.items():
            name = "outputs" if split == "eval" else "calibration_outputs"
            outputs.save(self.out / "reference" / f"{name}.npz")
        write_npz(self.out / fitted_state.RUN_FILE, fitted_state.state_of(self.ref_model))

    def _outputs(self, model, split, what):
        ts = self.tasksets[split]
        with tqdm(total=len(ts), desc=f"{what} · {split}", unit="ex", leave=False,
                  disable=not self.cfg.progress) as bar:
            return model.outputs(ts, self.batches[split], progress=bar.update)

    # -- cold start ---------------------------------------------------------------------------
    def _cold_start(self, spec, what):
        with self.clock("cold_start"):
            res = measure_cold_start(spec)
        self.clock.counts["cold_starts"] += 1
        if "error" in res:
            self.log(f"{what}: cold start not measured ({res['error']})")
        else:
            self.log(f"{what}: cold start from the {res.get('source', 'checkpoint')} "
                     f"{res['total_s']:.2f} s (import {res['import_s']:.2f}, "
                     f"weights {res['weight_load_s']:.2f}, build {res['build_s']:.2f}, first "
                     f"forward {res['first_forward_ms']:.0f} ms at B={res['batch_size']}; "
                     f"load-time peak {res.get('load_peak_memory_bytes', 0) / 1e6:.1f} MB)")
        return res

    def reference_cold_start(self, timing_sets):
        """The reference's cold start (fresh process), reused from an earlier run.json."""
        if self.cfg.cold_start == "none":
            return None
        old = self.previous_meta.get("cold_start")
        if old and "error" not in old:
            return old
        return self._cold_start(cold_start_spec(self, timing_sets), "reference")

    def _earlier_variants(self):
        """Names of judged variant folders in the run that this sweep's variants are not
        (build.json, timing.json, outputs.npz and calibration_outputs.npz present), sorted."""
        mine = {v.name for v in self.cfg.variants} | {"reference"}
        need = ("build.json", "timing.json", "outputs.npz", "calibration_outputs.npz")
        return sorted(p.name for p in self.out.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and p.name not in mine
                      and all((p / f).is_file() for f in need))

    def judge(self, name):
        """Recompute metrics, verdict and the variant's own report from its saved outputs."""
        return judge_variant(self.out, name, self.contract, near_tie_margin=self.cfg.near_tie_margin,
                             outputs=self.cfg.resolve_model().outputs)

    # -- the whole run ----------------------------------------------------------------------
    def run(self):
        """Run the sweep, holding the run folder's lock (:mod:`runs.lock`) throughout.

        run.json says ``"running"`` from the first write into the run folder (after the
        reference's cache files were read and validated) until every output is in place (summary.csv,
        plots/, report.md); only then is its final status written: ``"complete"``, or
        ``"partial"``/``"failed"`` when variants failed to build. A write that fails (disk full,
        permission denied) leaves ``"incomplete"`` with ``error`` {file, error} and raises
        :class:`runs.io.WriteError`; a plotting bug, or a report.html that cannot be rendered,
        leaves ``"incomplete"`` too (summary.csv and report.md are written) and raises
        :class:`RunIncomplete` naming the missing output and why (exit 1, one line). Rerunning
        the same command finishes such a run. On start, temp files a killed writer left in the
        run folder (and in the cache, when no other sweep uses it) are removed.
        """
        self.clock = SweepClock()
        with self.clock("setup"):
            self.prepare()
            created = missing_folders(self.out) + missing_folders(self.cache)
            try:
                self.out.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SweepError(f"--results-dir {self.root}: cannot create {self.out.name}/ "
                                 f"({e.strerror or type(e).__name__}); pass a writable folder"
                                 ) from None
        try:
            with runlock.hold(self.out, log=self.log), \
                    runlock.cache_lock(self.cache, when_alone=self._clean_cache):
                try:
                    return self._run_locked()
                except VariantsFailed:  # run.json already has its final status
                    raise
                except BaseException as e:  # noqa: BLE001 - recorded, then raised as it was
                    self._mark_incomplete(e, always=isinstance(e, (WriteError, RunIncomplete,
                                                                    ReferenceNotFinite)))
                    raise
        except BaseException:  # stopped before writing (e.g. the head's fit): no empty folders
            remove_empty_folders(sorted(set(created), key=lambda p: -len(p.parts)),
                                 cache=self.cache)
            raise

    def _clean_cache(self):
        removed = remove_temp_files(self.cache)
        if removed:
            self.log(f"{self.cache}: removed {len(removed)} leftover temp file(s) of a killed writer")

    def _mark_incomplete(self, error, always=True):
        """run.json: status "incomplete" and the error (best effort: the disk may be full).
        With ``always`` False only a run.json this sweep set to "running" is changed: no
        exception (a bug, Ctrl-C) leaves a run that claims to be running after the process
        ends, and an input refused before that leaves the folder as it was."""
        file = getattr(error, "filename", None) or getattr(error, "file", None)
        meta = read_json(self.out / "run.json")
        meta = meta if isinstance(meta, dict) else {}
        if not always and not (self.wrote_running
                               and meta.get("status") == "running"):
            return  # refused before this sweep wrote a thing: the folder is as it was
        text = str(error) or type(error).__name__  # KeyboardInterrupt has no message
        meta.update(identity=self.cfg.identity(), status="incomplete",
                    error={"file": str(file) if file else None, "error": text})
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
            self.previous_meta = read_json(self.out / "run.json")
        # the reference's cache files are read (and validated) before the run folder changes:
        # a corrupt cache file stops the sweep with nothing in the folder rewritten
        self.reference()
        check_reference_fit(self.out, self.previous_meta, self.ref_model.fitted_record)
        with self.clock("setup"):
            self._write_identity()
            self.save_reference()
        family = get_family(cfg.family)
        with self.clock("setup"):
            timing_sets = timing_batches(self.ref_model, self.tasksets["eval"],
                                         cfg.timing_batch_sizes, cfg.seed)
        self.cold_start = self.reference_cold_start(timing_sets)
        with self.clock("timing"):
            self.segment_profile = reference_profile(self.ref_model, timing_sets, cfg.family,
                                                     cfg.timing_rounds)
        rows, details, extras = [], {}, {}
        self.failed = {}
        premeasure(self)  # --executor process|ray: every quality pass first, on the workers
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
                extras.update({k: v for k, v in family_extras(
                    self.out, cfg.family, [vcfg.name], family=family).items() if v is not None})
            self.log(f"{vcfg.name}: {verdict.word}"
                     + (f" ({', '.join(verdict.failed + verdict.undecided)})"
                        if verdict.failed or verdict.undecided else "")
                     + verdict.unjudged_text())
        self.extras = extras
        if not rows:
            meta = self.metadata()
            write_json(self.out / "run.json", meta)
            raise VariantsFailed(self.failed, None, self.out)
        # judged variants that earlier sweeps left in this run folder (another family swept
        # into the same --run, or variants this sweep did not ask for) join the run's table, as
        # `variants check` shows them: one table for W8A8 beside ONNX Runtime's int8
        for name in self._earlier_variants():
            with self.clock("metrics_contract_report"):
                row, ev, verdict = self.judge(name)
            rows.append(row)
            details[name] = (ev, verdict)
        with self.clock("metrics_contract_report"):
            summary = pd.DataFrame(rows)
            write_csv(self.out / "summary.csv", summary)
            # the plots read run.json; its status stays "running" until report.md is written
            write_json(self.out / "run.json", dict(self.metadata(), status="running"))
        from runs.plots.markdown import plots_markdown
        from runs.plots.render import plot_run
        from runs.html.render import write_beside_markdown

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
            if plot_error is not None:  # what run.json will say (_mark_incomplete)
                meta["status"] = "incomplete"
            write_text(self.out / "report.md",
                       render_report(meta, summary, details, self.contract, extras)
                       + plots_markdown(plot_paths, self.out))
            # a report that cannot render fails the run (RunIncomplete: run.json incomplete)
            write_beside_markdown(self.out, status=meta["status"],
                                  evaluations={n: ev for n, (ev, _) in details.items()})
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
        """run.json's content now (:func:`variants.sweep.meta.run_metadata`)."""
        return run_metadata(self)


def run_sweep(log=print, config=None, **kwargs):
    """Run the sweep of ``config`` (a :class:`SweepConfig` already validated, as ``variants
    sweep`` passes it) or else of ``kwargs`` (its fields, validated here once).

    Returns summary.csv's table (pandas.DataFrame, one row per variant).

    Raises
    ------
    SweepError, contracts.checker.ContractError, variants.checkpoints.load.CheckpointError
        On bad input, before anything is written (a variant folder of this run that was built
        with other settings is bad input too).
    VariantsFailed
        At the end, when a variant's build raised ValueError: the other variants were written
        (``summary`` attribute; None when none succeeded), run.json lists the failures.

    A ``VARIANTS_BLAS`` library that could not be loaded is a SweepError too (as ``variants``
    refuses it): nothing would be timed on the BLAS the user asked for.
    """
    from variants import BLAS_INFO

    if BLAS_INFO.get("error"):
        raise SweepError(BLAS_INFO["error"])
    cfg = config if config is not None else SweepConfig(**kwargs).validate()
    return Sweep(cfg, log=log).run()
