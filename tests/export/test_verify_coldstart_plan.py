"""``variants verify DIR --cold-start``'s plan (variants.export.coldstart.plan), read from a
hand-made config.json: a quant export times both sides; a low-rank one the folder alone, with a
note (its build reads calibration activations); a quant export whose fp32 checkpoint folder is
gone is refused in one line naming it and the fix, before anything is timed."""

import json

import pytest


def _folder(tmp_path, family, ref, method=None):
    d = tmp_path / "exp"
    d.mkdir(parents=True)
    block = {"family": family, "reference_checkpoint": ref}
    if method:
        block["variant_config"] = {"bits": 4, "method": method}
    (d / "config.json").write_text(json.dumps({"mlx_variants": block}))
    return d


def test_quant_times_both_sides(tmp_path):
    from variants.export.coldstart import plan

    assert plan(_folder(tmp_path, "quant", str(tmp_path))) == (("exported", "fp32"), None)
    assert plan(_folder(tmp_path / "b", "quant", None))[0] == ("exported", "fp32")  # bundled


def test_lowrank_times_the_folder_alone_and_says_so(tmp_path):
    from variants.export.coldstart import plan

    modes, note = plan(_folder(tmp_path, "lowrank", str(tmp_path / "gone")))
    assert modes == ("exported",) and "quant variants only, not lowrank" in note


@pytest.mark.parametrize("method", ["awq", "gptq", "dwq"])
def test_a_learned_quantizer_times_the_folder_alone_and_says_so(tmp_path, method):
    """Its fp32 build would learn again from a fit split the folder does not ship."""
    from variants.export.coldstart import plan

    modes, note = plan(_folder(tmp_path, "quant", str(tmp_path), method))
    assert modes == ("exported",) and f"--quant-method {method} learns from the fit" in note
    assert plan(_folder(tmp_path / "r", "quant", str(tmp_path), "rtn"))[0] == ("exported", "fp32")


def test_quant_with_a_moved_fp32_checkpoint_is_refused(tmp_path):
    from variants.export.coldstart import plan
    from variants.export.source import ExportError

    gone = tmp_path / "moved-away"
    with pytest.raises(ExportError) as e:
        plan(_folder(tmp_path, "quant", str(gone)))
    msg = str(e.value)
    assert f"fp32 checkpoint {gone}, which is not a folder any more" in msg, msg
    assert msg.endswith("drop --cold-start") and "\n" not in msg
