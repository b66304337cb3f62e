"""Which variants cold-start from their exported weights folder, and the fall-back to the fp32
checkpoint + build when the folder does not load (a sweep keeps its cold start either way).
Stubbed sweep, no model: the real child is tested in tests/export/test_export.py."""

from types import SimpleNamespace

import variants.sweep.cold_variant as cv
from variants.families import get_family


class _Clock:
    def __call__(self, _):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _sweep(speed_mode, answers):
    specs, logs = [], []

    def cold(spec, what):
        specs.append(spec)
        return answers.pop(0)
    cfg = SimpleNamespace(speed_mode=speed_mode, family="quant", batch_size=32,
                          near_tie_margin=0.1, resolve_model=lambda: "source")
    return SimpleNamespace(cfg=cfg, clock=_Clock(), _cold_start=cold, checkpoint="ck",
                           log=logs.append), specs, logs


def test_exporting_families_timed_natively_start_from_the_artifact(monkeypatch):
    written = []
    monkeypatch.setattr(cv, "write_weights", lambda *a, **k: written.append(a[3]))
    monkeypatch.setattr(cv, "cold_start_spec",
                        lambda s, t, f, v, artifact=None: {"artifact": artifact})
    vcfg = get_family("quant").config(bits=4)
    sweep, specs, logs = _sweep("native", [{"source": "exported artifact"}])
    assert cv.from_artifact(sweep, get_family("lowrank"))
    assert cv.from_artifact(sweep, get_family("prune"))  # the rule beside the weights (#41)
    assert cv.from_artifact(sweep, get_family("exit"))  # ... and the exit heads
    assert not cv.from_artifact(sweep, get_family("student"))
    assert not cv.from_artifact(sweep, get_family("exact"))
    assert cv.from_artifact(sweep, get_family("w8a8"))  # its int8 state is stored (#41)
    res = cv.variant_cold_start(sweep, get_family("quant"), vcfg, {}, model="built")
    assert res == {"source": "exported artifact"} and specs == [{"artifact": written[0]}]
    # simulated speed mode: the fp32 checkpoint + build, no folder written
    sweep, specs, _ = _sweep("simulated", [{"source": "fp32 checkpoint + build"}])
    assert not cv.from_artifact(sweep, get_family("quant"))
    cv.variant_cold_start(sweep, get_family("quant"), vcfg, {}, model="built")
    assert specs == [{"artifact": None}] and len(written) == 1
    # a folder the child cannot load: measured the old way, the child's error kept
    sweep, specs, logs = _sweep("native", [{"error": "exit 1: boom"},
                                           {"source": "fp32 checkpoint + build"}])
    res = cv.variant_cold_start(sweep, get_family("quant"), vcfg, {}, model="built")
    assert res == {"source": "fp32 checkpoint + build", "artifact_error": "exit 1: boom"}
    assert specs[0]["artifact"] is not None and specs[1] == {"artifact": None}
    assert "did not load in a fresh process" in logs[0]
