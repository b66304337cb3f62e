"""The sweep's own time: breakdown in run.json, a warm rerun runs no model forward,
an old timing.json (forward only) is completed on resume and still passes `variants check`."""

import json

import pytest

from variants.cli import main

TINY = ["sweep", "--bits", "8", "--n-fit", "60", "--n-calibration", "40", "--n-eval", "40",
        "--timing-batch-sizes", "1", "--timing-rounds", "2", "--timing-warmup", "0",
        "--speed-mode", "simulated", "--no-progress", "--run", "t"]


@pytest.mark.slow
def test_rerun_skips_reference_forwards_and_resume_fills_old_timing(tmp_path, monkeypatch, capsys):
    import variants.sweep.run as sweep_mod
    from runs.judge import check_run
    from variants.models.sentiment import SentimentNet

    calls = {"module": 0, "cold": 0}
    real_call, real_embed = SentimentNet.__call__, SentimentNet.embed

    def counted(real):
        def inner(self, *a, **k):
            calls["module"] += 1
            return real(self, *a, **k)
        return inner

    def fake_cold(spec, **_):
        calls["cold"] += 1
        return {"startup_s": 0.1, "import_s": 1.0, "weight_load_s": 0.2, "build_s": 0.0,
                "first_tokenise_ms": 1.0, "first_forward_ms": 30.0, "second_forward_ms": 20.0,
                "total_s": 1.33, "model_bytes": 1, "peak_memory_bytes": 2, "batch_size": 1,
                "seq_len": 9, "what": spec.get("variant") or "reference"}

    monkeypatch.setattr(SentimentNet, "__call__", counted(real_call))
    monkeypatch.setattr(SentimentNet, "embed", counted(real_embed))
    monkeypatch.setattr(sweep_mod, "measure_cold_start", fake_cold)
    args = [*TINY, "--results-dir", str(tmp_path / "r")]
    run = tmp_path / "r" / "t"

    assert main(args) in (0, 1)
    err = capsys.readouterr().err
    assert "sweep wall time" in err and "outside model forwards" in err
    meta = json.loads((run / "run.json").read_text())
    st = meta["sweep_time"]
    assert st["counts"]["reference_output_batches"] > 0 and st["counts"]["variants_built"] == 1
    assert sum(st["seconds"].values()) == pytest.approx(st["wall_s"], rel=1e-6)
    assert 0.0 <= st["outside_forward_share"] <= 1.0
    assert meta["cold_start"]["what"] == "reference" and calls["cold"] == 2
    timing = json.loads((run / "q8-g64" / "timing.json").read_text())
    assert timing["schema_version"] == 2 and set(timing["timed_regions"]) == {"forward", "end_to_end"}
    fwd, e2e = timing["batches"]["1"], timing["end_to_end"]["1"]
    assert fwd["rounds_requested"] == 2 and fwd["rounds"] == 2 and fwd["stopped_by"] == "rounds"
    assert e2e["ref"]["p50_ms"] >= fwd["ref"]["p50_ms"]
    assert timing["model_bytes"]["reference"] > 0 and timing["cold_start"]["what"] == "q8-g64"
    report = (run / "report.md").read_text()
    for text in ("forward vs end to end", "Cold start", "Where this sweep's time went"):
        assert text in report

    # warm rerun: everything from the cache and the run folder; not one model call
    calls.update(module=0, cold=0)
    assert main(args) in (0, 1)
    meta = json.loads((run / "run.json").read_text())
    assert calls == {"module": 0, "cold": 0}
    assert meta["sweep_time"]["counts"]["reference_output_batches"] == 0
    assert all(meta["reference_outputs_from_cache"].values())

    # a timing.json from before end-to-end timing: `variants check` reads it, resume completes it
    old = {k: timing[k] for k in ("timed_region", "mode", "dtype", "device", "blas", "wall_s")}
    old["batches"] = {"1": {k: v for k, v in fwd.items()
                            if k not in ("rounds_requested", "timed_region", "measured_as")}}
    (run / "q8-g64" / "timing.json").write_text(json.dumps(old))
    check_run(run)
    assert "forward vs end to end" in (run / "report.md").read_text()
    capsys.readouterr()
    assert main(args) in (0, 1)
    assert "end to end missing" in capsys.readouterr().err
    new = json.loads((run / "q8-g64" / "timing.json").read_text())
    assert new["batches"]["1"]["ref_ms"] == fwd["ref_ms"]  # the earlier measurement is kept
    assert new["end_to_end"]["1"]["rounds"] == 2 and "cold_start" in new
    assert new["schema_version"] == 2
