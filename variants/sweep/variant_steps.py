"""The sweep's per-variant steps: build, run, time, save and judge one variant, or reuse its
folder (a resumed run). A mixin of :class:`variants.sweep.run.Sweep`, whose state it reads
(``cfg``, ``out``, ``ref_model``, ``tasksets``, ``cache``, ``clock``, ``log``, ``reused``)."""

import shutil
import time

import mlx.core as mx

from runs.io import write_json
from runs.readers import CorruptFileError
from variants.families.family import BuildInputs, judged_mode
from variants.sweep import timed_check
from variants.sweep.cold_variant import variant_cold_start
from variants.sweep.quality import quality_outputs
from variants.sweep.resume import complete_reused_timing, read_json
from variants.sweep.timing import time_pair


class VariantSteps:
    """Sweep methods for one variant (module docstring)."""

    def _inputs(self, family):
        """The :class:`BuildInputs` of ``family``'s build: the ones its ``inputs`` names."""
        return BuildInputs(calibration=self.tasksets["calibration"], fit=self.tasksets["fit"],
                           cache_dir=self.cache).only(family.inputs)

    def _time_variant(self, family, vcfg, timing_sets, extra=True, keep_model=False):
        """timing.json content for ``timing_sets`` ({B: (TaskSet, seq_len)}): the variant is
        built in the speed mode, then per batch size one alternated measurement of end-to-end
        calls gives both regions (``batches`` = forward, ``end_to_end``); with ``extra`` the
        family's own ``time_extra`` fields join. ``keep_model``: return ``(timing, the
        variant built)`` (its cold start writes that model's weights folder)."""
        cfg = self.cfg
        with self.clock("variant_build"):
            var_model, info = family.build(self.ref_model, vcfg, self._inputs(family),
                                           mode=cfg.speed_mode)
            mx.eval(var_model.module.parameters())
        with self.clock("timing"):
            timed = (var_model if family.timed_variant is None
                     else family.timed_variant(var_model, vcfg))
            timing = time_pair(self.ref_model, timed, timing_sets, cfg,
                               ideal_speedup=info.get("ideal_speedup"),
                               max_speedup=info.get("max_speedup"))
            if extra and family.time_extra is not None:
                timing.update(family.time_extra(self.ref_model, var_model,
                                                self.tasksets["eval"], cfg, vcfg))
            return (timing, var_model) if keep_model else timing

    def variant(self, family, vcfg, timing_sets):
        """Build, run and time one variant unless its folder already holds the results."""
        vdir = self.out / vcfg.name
        files = {n: vdir / n for n in ("outputs.npz", "calibration_outputs.npz", "build.json",
                                       "timing.json")}
        reusable = all(f.exists() for f in files.values())  # validated in prepare()
        if reusable:
            why = timed_check.stale(read_json(files["build.json"]) or {},
                                    judged_mode(family, self.cfg, vcfg))
            if why:
                self.log(f"{vcfg.name}: {why}; building, judging and timing it again")
                reusable = False
        if reusable:
            self.log(f"{vcfg.name}: outputs and timing found, reusing them (resume)")
            self.reused.append(vcfg.name)
            self.clock.counts["variants_reused"] += 1
            complete_reused_timing(self, family, vcfg, timing_sets, files["timing.json"])
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
        outs, info = quality_outputs(self, family, vcfg)  # here, or its executor's results
        if info.get("row_map"):  # a table stored by use: its unseen rows' eval rows apart
            from variants.families.quant.row_use import eval_ids_apart

            info["unseen_eval_ids"] = eval_ids_apart(self.ref_model, self.tasksets, vcfg, info)
        t1 = time.perf_counter()
        timing, timed = self._time_variant(family, vcfg, timing_sets, keep_model=True)
        timing["wall_s"] = time.perf_counter() - t1
        # the judged model is the model that runs (or the variant is refused: ValueError)
        info["timed_check"] = timed_check.check(self, vcfg.name, info, outs["eval"], timed)
        if cfg.cold_start == "all":  # from its exported weights where the family exports
            timing["cold_start"] = variant_cold_start(self, family, vcfg, timing_sets, timed)
        del timed
        with self.clock("metrics_contract_report"):
            outs["eval"].save(files["outputs.npz"])
            outs["calibration"].save(files["calibration_outputs.npz"])
            write_json(files["build.json"], info)
            write_json(files["timing.json"], timing)
        with self.clock("metrics_contract_report"):
            return self.judge(vcfg.name)

