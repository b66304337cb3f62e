"""run.json's ``segment_profile``: a tiny sweep records the reference's segment profile and the
Amdahl ceilings of its family, report.html shows them; a reference it cannot profile, or a rough
timing, records one line saying why."""

import json
from types import SimpleNamespace

import pytest

from variants.cli import main
from variants.sweep.profile import FAMILY_SEGMENTS, SEGMENTS
from variants.sweep.ref_profile import MIN_TIMING_ROUNDS, reference_profile, skip_reason

# tests/export/test_export.py's tiny flags, with the 3 timing rounds the profile needs and a B=4
# timing batch (the texts profiled)
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "3",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
        "--timing-batch-sizes", "4", "--no-progress", "--contract", "lenient"]


@pytest.mark.html
def test_tiny_sweep_records_segment_profile_and_report_html_shows_it(tmp_path):
    root = tmp_path / "r"
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "q", "--bits", "8"]) == 0
    run = root / "q"
    prof = json.loads((run / "run.json").read_text())["segment_profile"]
    assert "skipped" not in prof
    assert set(prof["share"]) == set(SEGMENTS)
    assert prof["batch_size"] == 4 and prof["n_layers"] == 6 and prof["rounds"] == 3
    assert all(p >= 0 for p in prof["share"].values())
    total = sum(prof["share"].values())
    assert total <= 1 + 1e-9
    # the segments and what they leave unattributed make up the whole forward
    assert prof["total_ms"] > 0
    assert prof["unattributed_ms"] == pytest.approx(prof["total_ms"] - prof["segments_sum_ms"],
                                                    rel=1e-9, abs=1e-9)
    if prof["unattributed_share"] >= 0:  # shares are of the whole forward
        assert total + prof["unattributed_share"] == pytest.approx(1.0, abs=1e-9)
    assert set(FAMILY_SEGMENTS) <= set(prof["ceilings"])
    for c in prof["ceilings"].values():
        assert 0 <= c["share"] <= 1 and c["ceiling"] >= 1
        assert c["ceiling"] == pytest.approx(1 / (1 - c["share"]), rel=1e-9)
    assert prof["family"] == "quant" and prof["family_ceiling"] == prof["ceilings"]["quant"]
    quant = sum(prof["share"][s] for s in FAMILY_SEGMENTS["quant"])
    assert prof["family_ceiling"]["share"] == pytest.approx(quant, rel=1e-9)
    html = (run / "report.html").read_text()
    assert "Reference forward: segment profile" in html
    assert 'class="segment-profile"' in html and 'class="amdahl-ceilings"' in html
    assert "qkv_proj" in html and "Amdahl ceiling" in html


def test_not_profiled_reference_records_one_line_reason():
    # a reference whose encoder is not BERT-style (ModernBERT): nothing timed, one line why
    other = SimpleNamespace(module=SimpleNamespace(encoder=SimpleNamespace()))
    reason = skip_reason(other, 50)
    assert reason is not None and "SimpleNamespace" in reason and "\n" not in reason
    assert reference_profile(other, {1: None}, "quant", 50) == {"skipped": reason}


def test_rough_timing_skips_profile():
    from variants.arch.encoder import BertEncoder
    bert = SimpleNamespace(module=SimpleNamespace(encoder=BertEncoder.__new__(BertEncoder),
                                                  head=None))
    assert skip_reason(bert, MIN_TIMING_ROUNDS) is None
    reason = skip_reason(bert, MIN_TIMING_ROUNDS - 1)
    assert "--timing-rounds" in reason
    assert reference_profile(bert, {1: None}, "quant", MIN_TIMING_ROUNDS - 1) == {"skipped": reason}


def test_marker_reference_records_one_line_reason():
    # a marker model reads its logits at the option markers: no module head, no option cosine
    from variants.arch.encoder import BertEncoder

    class MarkerModel:
        module = SimpleNamespace(encoder=BertEncoder.__new__(BertEncoder))

    reason = skip_reason(MarkerModel(), 50)
    assert reason is not None and "MarkerModel" in reason and "\n" not in reason
    assert reference_profile(MarkerModel(), {1: None}, "quant", 50) == {"skipped": reason}
