"""--device / --dtype / VARIANTS_DEVICE (variants.runtime.device): parsed, bad values refused in one
line before anything is written, half precision refused on the CPU, a GPU refused here with the
install command, run.json and the resume identity record the device, every cache key changes
with it, and the CPU-only fast paths stand aside off the CPU. The GPU forward test runs only
where MLX has a GPU backend (marker ``gpu``)."""

import json

import mlx.core as mx
import numpy as np
import pytest

from runs.io import write_json
from variants.runtime import device, parallel, qlinear
from variants.cli import main
from variants.sweep.config import SweepConfig, SweepError
from variants.sweep.resume import check_run_folder

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "1", "--timing-warmup", "0", "--cold-start", "none", "--no-progress",
        "--bits", "4"]
NO_GPU = device.backend() is None


def test_flag_and_environment_variable_parse(monkeypatch):
    monkeypatch.delenv(device.ENV, raising=False)
    assert device.requested() == "cpu"
    assert device.requested("gpu") == "gpu"
    monkeypatch.setenv(device.ENV, "gpu")
    assert device.requested() == "gpu"
    assert device.requested("cpu") == "cpu"  # the flag wins over the variable
    monkeypatch.setenv(device.ENV, "cpu")
    cfg = SweepConfig(n_fit=60, n_calibration=40, n_eval=40, timing_batch_sizes=(1,)).validate()
    assert (cfg.device, cfg.dtype) == ("cpu", "float32")
    assert {"device", "dtype"} <= set(cfg.identity())


@pytest.mark.parametrize("args, env, message", [
    (["--device", "tpu"], None, "--device 'tpu' is not a device; choose cpu or gpu"),
    ([], "xpu", "VARIANTS_DEVICE='xpu' is not one of: cpu, gpu; set one of them"),
    (["--dtype", "fp8"], None, "--dtype 'fp8' is not supported; choose one of float32, "),
    (["--dtype", "float16"], None, "--dtype float16 needs --device gpu: MLX's CPU backend has no "
                                   "BLAS path for float16/bfloat16"),
    (["--device", "cpu", "--dtype", "bfloat16"], "gpu", "--dtype bfloat16 needs --device gpu"),
])
def test_bad_values_are_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, args, env,
                                                        message):
    if env is None:
        monkeypatch.delenv(device.ENV, raising=False)
    else:
        monkeypatch.setenv(device.ENV, env)
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err, err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(not NO_GPU, reason="MLX has a GPU backend here: --device gpu is accepted")
@pytest.mark.parametrize("how", ["flag", "env"])
def test_gpu_without_a_backend_names_what_was_found_and_the_install(tmp_path, capsys, monkeypatch,
                                                                    how):
    monkeypatch.setenv(device.ENV, "gpu") if how == "env" else None
    args = ["--device", "gpu"] if how == "flag" else []
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "mx.metal.is_available()=False" in err and "mx.cuda.is_available()=" in err
    assert "mx.default_device()=Device(cpu, 0)" in err
    assert 'pip install "mlx[cuda13]==0.32.4"' in err
    assert not (tmp_path / "r").exists()
    assert mx.default_device() == mx.cpu  # nothing was switched


def test_run_json_records_device_and_a_resume_on_another_device_is_refused(tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.delenv(device.ENV, raising=False)
    root = tmp_path / "r"
    assert main(["sweep", "--results-dir", str(root), "--run", "a", *TINY]) == 0
    capsys.readouterr()
    run_json = root / "a" / "run.json"
    meta = json.loads(run_json.read_text())
    assert (meta["device"], meta["dtype"]) == ("cpu", "float32")
    assert meta["device_info"] == {"device": "cpu", "backend": None, "dtype": "float32",
                                   "mlx_device": "Device(cpu, 0)"}
    assert (meta["identity"]["device"], meta["identity"]["dtype"]) == ("cpu", "float32")
    timing = json.loads((root / "a" / "q4-g64" / "timing.json").read_text())
    assert timing["dtype"] == "float32"
    # the same folder swept on a GPU: refused before anything is written
    meta["identity"]["device"] = "gpu"
    write_json(run_json, meta)
    before = run_json.read_text()
    assert main(["sweep", "--results-dir", str(root), "--run", "a", *TINY]) == 2
    err = capsys.readouterr().err
    assert "holds a sweep with other settings {'device': ('gpu', 'cpu')}" in err, err
    assert run_json.read_text() == before


@pytest.mark.parametrize("recorded, refused", [("Device(cpu, 0)", False),
                                               ("Device(gpu, 0)", True), (None, False)])
def test_a_run_from_before_the_flag_resumes_on_the_device_it_recorded(tmp_path, recorded, refused):
    """Older run.json identities lack device/dtype: the top-level device they recorded (none:
    cpu) and float32 stand in."""
    cfg = SweepConfig(n_fit=60, n_calibration=40, n_eval=40, timing_batch_sizes=(1,),
                      device="cpu").validate()
    ident = {k: v for k, v in json.loads(json.dumps(cfg.identity())).items()
             if k not in ("device", "dtype")}
    meta = {"identity": ident} if recorded is None else {"identity": ident, "device": recorded}
    (tmp_path / "run").mkdir()
    write_json(tmp_path / "run" / "run.json", meta)
    cfg.variants = []
    if refused:
        with pytest.raises(SweepError, match=r"'device': \('gpu', 'cpu'\)"):
            check_run_folder(tmp_path / "run", cfg, {})
    else:
        check_run_folder(tmp_path / "run", cfg, {})


def test_every_cache_key_changes_with_device_backend_and_dtype(checkpoint, monkeypatch):
    from variants.models import sentiment

    model = sentiment.build(checkpoint)
    cpu = model.cache_key("weights", "data")
    assert model.cache_key("weights", "data") == cpu  # stable on one device
    monkeypatch.setattr(device, "current", lambda: "gpu")
    monkeypatch.setattr(device, "backend", lambda: "cuda")
    cuda = model.cache_key("weights", "data")
    monkeypatch.setattr(device, "backend", lambda: "metal")
    metal = model.cache_key("weights", "data")
    monkeypatch.setitem(device._state, "dtype", "float16")
    half = model.cache_key("weights", "data")
    assert len({cpu, cuda, metal, half}) == 4
    assert device.key_part() == {"device": "gpu", "backend": "metal", "dtype": "float16"}


def test_cpu_fast_paths_stand_aside_off_the_cpu(checkpoint, monkeypatch):
    import mlx.nn as nn

    lin = nn.Linear(128, 64)
    fast = qlinear.use_cpu_path(nn.QuantizedLinear.from_linear(lin, 64, 4))
    assert fast.kernel != "quantized_matmul"  # the dequantize + GEMM path on the CPU
    monkeypatch.setenv("VARIANTS_STREAMS", "2")
    monkeypatch.setitem(parallel._state, "streams", None)
    assert len(parallel.streams()) == 2
    monkeypatch.setattr(device, "is_cpu", lambda: False)
    assert fast.kernel == "quantized_matmul"
    ss = parallel.streams()  # rebuilt for the new device: one stream, no CPU split
    assert len(ss) == 1 and ss[0] == mx.default_stream(mx.default_device())
    monkeypatch.undo()
    parallel._state["streams"] = None  # the next user builds the CPU streams again


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [None, 4])
def test_gpu_forward_equals_cpu_forward(checkpoint, bits):
    """The reference (``bits`` None) and a 4-bit native variant: pooled embeddings on the GPU
    equal the CPU's to 1e-4 (CPU: unpack+GEMM; GPU: mx.quantized_matmul)."""
    from variants.families.quant.family import QuantConfig
    from variants.families.quant.build import quantize_module
    from variants.models import sentiment

    module = sentiment.build(checkpoint).module
    if bits is not None:
        module, _ = quantize_module(module, QuantConfig(bits=bits), "native")
    rng = np.random.default_rng(0)
    ids = mx.array(rng.integers(1000, 30000, (3, 20)), mx.int32)
    mask = mx.array((np.arange(20)[None] < np.array([[20], [13], [5]])).astype(np.int32))
    types = mx.zeros_like(ids)
    cpu = np.array(module.embed(ids, mask, types))
    try:
        device.use("gpu")
        assert not device.is_cpu() and len(parallel.streams()) == 1
        gpu = np.array(module.embed(ids, mask, types))
    finally:
        mx.set_default_device(mx.cpu)
    assert np.abs(cpu).max() > 0.1  # real embeddings, not zeros
    np.testing.assert_allclose(gpu, cpu, atol=1e-4, rtol=1e-4)


def test_benchmark_flags_refuse_in_one_line(capsys):
    import argparse

    p = device.add_arguments(argparse.ArgumentParser())
    assert device.from_args(p.parse_args([])) == "cpu"
    with pytest.raises(SystemExit) as e:
        device.from_args(p.parse_args(["--dtype", "float16"]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no BLAS path for float16/bfloat16" in err
    assert mx.default_device() == mx.cpu


def test_bfloat16_outputs_and_head_fit_reach_numpy_as_float32(checkpoint, monkeypatch):
    """What a GPU sweep with --dtype bfloat16 converts (NumPy has no bfloat16), run on two
    short texts on the CPU: logits and the head's embeddings arrive as float32, within bfloat16
    round-off of the float32 model's."""
    import pandas as pd

    from variants.models import sentiment

    frame = pd.DataFrame({"id": ["a", "b", "c"], "domain": ["movie"] * 3,
                          "text": ["great fun", "awful, boring", "it was fine"],
                          "mean_rating": [3.0, -3.0, 0.0], "rater_scores": [(3,), (-3,), (0,)],
                          "groundtruth_mean": [3.0, -3.0, 0.0]})
    ts = sentiment.make_taskset(frame)
    ref = sentiment.build(checkpoint)
    ref.fit_head(ts)
    ref.temperatures = {3: 1.0}
    want = ref.outputs(ts).logits
    half = copy_of(ref)
    half.module.set_dtype(mx.bfloat16)
    assert half.module.encoder.layers[0].attention.query.weight.dtype == mx.bfloat16
    got = half.outputs(ts).logits
    assert got.dtype == np.float32 and got.shape == want.shape == (3, 3)
    np.testing.assert_allclose(got, want, atol=0.15 * np.abs(want).max())
    half.fit_head(ts)  # the embeddings reach sklearn as float32


def copy_of(model):
    import copy

    return model.replace_module(copy.deepcopy(model.module))
