"""Export of learned quantizers whose layers carry AWQ's input scale (``awq``, and ``dwq``
started from AWQ's scales): the folder lists those layers, the packed load puts them in place
(nothing re-quantized), verify recomputes the judged outputs, and the sweep's cold start loads
the same files."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

TINY = ["--model-config", "examples/model-bert-classifier.toml", "--n-fit", "40",
        "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1", "--timing-warmup",
        "0", "--timing-budget-s", "0.5", "--cold-start", "all", "--timing-batch-sizes", "1",
        "--no-progress", "--contract", "lenient", "--bits", "4", "--group-size", "32"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny judged run of the committed random-init BERT classifier, AWQ and DWQ at 4 bits
    (cold starts measured: they load the packed files), each variant exported."""
    from variants.cli import main

    root = tmp_path_factory.mktemp("learned")
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "m",
                 "--quant-method", "awq", "dwq"]) == 0
    out = {}
    for name in ("q4-g32-awq", "q4-g32-dwq"):
        out[name] = root / "exports" / name
        assert main(["export", str(root / "m"), "--variant", name, "--out", str(out[name]),
                     "--allow-fail"]) == 0
    return root, out


@pytest.mark.parametrize("name", ["q4-g32-awq", "q4-g32-dwq"])
def test_input_scaled_layers_load_packed_and_verify(exported, name):
    from variants.arch.input_scaled import InputScaledLinear
    from variants.export.load import load_variant
    from variants.export.verify import verify

    root, out = exported
    folder = out[name]
    listed = json.loads((folder / "config.json").read_text())["mlx_variants"]["input_scaled"]
    assert listed and all(p.startswith("encoder.layers.") for p in listed)
    build = json.loads((root / "m" / name / "build.json").read_text())
    assert len(listed) == build["input_scaled_layers"]
    model, _ = load_variant(folder)
    file = mx.load(str(folder / "model.safetensors"))
    names = json.loads((folder / "config.json").read_text())["mlx_variants"]["names"]
    mods = dict(model.module.named_modules())
    for path in listed:
        layer = mods[path]
        assert isinstance(layer, InputScaledLinear)
        assert isinstance(layer.linear, nn.QuantizedLinear) and layer.linear.bits == 4
        # stored under the Linear's transformers name, e.g.
        # bert.encoder.layer.0.attention.self.query.input_scale
        name = names[path]
        assert name.startswith("bert.encoder.layer.")
        assert mx.array_equal(layer.input_scale, file[f"{name}.input_scale"])
        assert mx.array_equal(layer.linear.weight, file[f"{name}.linear.weight"])
        assert not np.allclose(np.asarray(layer.input_scale), 1.0)  # AWQ's 1/s, not the default
    res = verify(folder, log=lambda m: None)
    assert res["ok"] and res["changed"] == [] and res["max_abs_dlogit"] <= 1e-5
    assert res["n_rows"] == 30


def test_cold_start_loaded_the_input_scaled_files(exported):
    root, _ = exported
    for name in ("q4-g32-awq", "q4-g32-dwq"):
        cold = json.loads((root / "m" / name / "timing.json").read_text())["cold_start"]
        assert cold["source"] == "exported artifact" and cold["first_forward_ms"] > 0
        assert [p.rsplit("/", 1)[1] for p in cold["weight_files_read"]] == ["model.safetensors"]


def test_a_folder_without_its_input_scaled_list_is_named_in_one_line(exported, tmp_path):
    """The weights then hold parameters the skeleton lacks: MLX lists each on a line of its
    own; the error is one line naming the file and the fix."""
    import shutil

    from variants.checkpoints.files import CheckpointError
    from variants.export.load import load_variant

    _, out = exported
    folder = tmp_path / "awq"
    shutil.copytree(out["q4-g32-awq"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["mlx_variants"]["input_scaled"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load_variant(folder)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 500
    assert "does not match its config.json" in msg and "input_scale" in msg
    assert msg.endswith("export the variant again")


@pytest.mark.parametrize("listed,says", [
    ("encoder.layers.0.attention.query", "input_scaled is str, not a list of layer paths"),
    (["bogus"], "input_scaled names 'bogus', not an encoder Linear"),
    (["encoder.layers.0.attention.query"] * 2, "input_scaled names a layer twice"),
    (["encoder.layers.9.bogus"], "encoder.layers.9.bogus is not a Linear of the model"),
])
def test_a_bad_input_scaled_list_is_refused_by_both_loaders(exported, tmp_path, listed, says):
    import shutil

    from variants.checkpoints.files import CheckpointError
    from variants.checkpoints.load import load_checkpoint
    from variants.export.load import load_variant

    _, out = exported
    folder = tmp_path / "awq"
    shutil.copytree(out["q4-g32-awq"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["mlx_variants"]["input_scaled"] = listed
    (folder / "config.json").write_text(json.dumps(cfg))
    for load in (load_variant, load_checkpoint):
        with pytest.raises(CheckpointError) as e:
            load(folder)
        msg = str(e.value)
        assert says in msg and "\n" not in msg and msg.endswith("export the variant again")


def test_a_truncated_weights_file_is_named_by_load_checkpoint(exported, tmp_path):
    import shutil

    from variants.checkpoints.files import CheckpointError
    from variants.checkpoints.load import load_checkpoint

    _, out = exported
    folder = tmp_path / "awq"
    shutil.copytree(out["q4-g32-awq"], folder)
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors cannot be read"):
        load_checkpoint(folder)
