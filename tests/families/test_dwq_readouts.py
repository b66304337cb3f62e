"""DWQ trains through the model's own readout: a marker model's scorer at the batch's marker
positions (its held-out KL is the inference forward's), and a model it cannot train is refused
by the quant family's model check, before anything is built or written."""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from metrics.softmax import masked_softmax
from variants.arch import activations
from variants.checkpoints.load import load_checkpoint
from variants.families import get_family
from variants.families.quant import affine_codes, dwq
from variants.families.quant import learned as quant_learned
from variants.families.quant.family import QuantConfig

ROOT = Path(__file__).parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"


@pytest.fixture(scope="module")
def marker_setup():
    from variants.sweep.config import SweepConfig
    from variants.sweep.inputs import load_inputs

    cfg = SweepConfig(model_config=str(ROOT / "examples" / "model-marker.toml"),
                      data=str(ROOT / "examples" / "vader_raters.jsonl"), family="quant",
                      n_fit=16, n_calibration=20, n_eval=10,
                      timing_batch_sizes=[1]).validate()
    _, checkpoint, tasksets = load_inputs(cfg)
    model = cfg.resolve_model().build(checkpoint)
    mx.random.seed(0)  # an unfitted scorer: random, so the options' logits differ
    model.module.scorer.weight = mx.random.normal(model.module.scorer.weight.shape) * 0.5
    model.temperatures = {}
    return model, tasksets["fit"]


def _kl(p, q, valid):
    return np.where(valid, p * (np.log(np.maximum(p, 1e-30)) - np.log(np.maximum(q, 1e-30))),
                    0.0).sum(axis=1).mean()


def test_dwq_marker_readout_is_the_inference_forwards(marker_setup):
    """With layer 5's Linears at 3 bits and a zero step, DWQ's held-out KL equals the KL of the
    inference forward of the same quantized weights (the scorer read at the marker tokens);
    then a real step lowers it."""
    model, fit = marker_setup
    mods = dict(model.module.named_modules())
    layers = {}
    for p in activations.target_linears(model.module):
        if ".5." in p:
            c, s, b = affine_codes.quantize(np.array(mods[p].weight), 3, 64)
            layers[p] = (c, s, b, 64, None)
    assert dwq._readout_kind(model) == "marker"
    _, _, f0 = dwq.distill(model, layers, fit, epochs=1, batch_size=4, learning_rate=0.0,
                           hidden_weight=0.0)
    dense = quant_learned._dense(model.module)
    for p, (c, s, b, _, _) in layers.items():
        lin = nn.Linear(c.shape[1], c.shape[0])
        lin.weight = mx.array(affine_codes.dequantize(c, s, b, 64))
        lin.bias = mods[p].bias
        activations.set_module(dense, p, lin)
    held = fit.subset(np.arange(len(fit) - f0["valid_texts"], len(fit)))
    batches, _ = model.prepare(held, 4)
    valid = np.asarray(held.option_mask, bool)
    ones = np.ones(len(held), np.float32)
    p = masked_softmax(model.raw_logits(held, batches), valid, ones).astype(np.float64)
    q = masked_softmax(model.replace_module(dense).raw_logits(held, batches), valid,
                       ones).astype(np.float64)
    kl = _kl(p, q, valid)
    assert kl > 1e-4
    np.testing.assert_allclose(f0["kl_before"], kl, rtol=1e-3)
    _, _, f = dwq.distill(model, layers, fit, epochs=3, batch_size=4, learning_rate=3e-5)
    assert f["step_means"][-1] < f["step_means"][0]


def test_dwq_on_a_model_it_cannot_train_is_refused_by_the_model_check():
    ckpt = load_checkpoint(HF / "modernbert")
    module = nn.Module()
    module.encoder = ckpt.encoder
    fam = get_family("quant")
    fam.check_model(module, [QuantConfig(method="gptq")])  # the other methods take it
    with pytest.raises(ValueError) as e:
        fam.check_model(module, [QuantConfig(method="rtn"), QuantConfig(method="dwq")])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--quant-method dwq trains through BERT / RoBERTa")
    assert "ModernBert" in msg and msg.endswith("use --quant-method gptq or awq for it")
    bert = nn.Module()  # BERT layers but no readout
    bert.encoder = load_checkpoint(HF / "roberta").encoder
    with pytest.raises(ValueError, match="--quant-method dwq needs the model's readout"):
        fam.check_model(bert, [QuantConfig(method="dwq")])
