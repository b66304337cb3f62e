"""DWQ trains the student the variant ships, through the model's own readout: the tables the
variant quantizes but DWQ does not learn are in the student; a cosine readout scores against the
student's own option embeddings and a marker model's scorer reads the batch's marker positions
(in both, the held-out KL DWQ reports is the inference forward's); a model it cannot train is
refused by the quant family's model check, before anything is built or written."""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from metrics.softmax import masked_softmax
from variants.arch import activations
from variants.checkpoints.load import load_checkpoint
from variants.datasets import bundled as data
from variants.families import get_family
from variants.families.quant import affine_codes, dwq
from variants.families.quant import build as quantize
from variants.families.quant import learned as quant_learned
from variants.families.quant.family import QuantConfig
from variants.models import choice

ROOT = Path(__file__).parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"


@pytest.fixture(scope="module")
def choice_model(checkpoint):
    model = choice.build(checkpoint)
    model.temperatures = {}
    return model


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


def _choice_fit(n):
    return choice.make_taskset(data.sample(data.split_frame(data.load_vader(), "fit"), n,
                                           seed=2))


def _tables_only_student(model, bits=3):
    """The model's module with its embedding tables round-to-nearest at ``bits`` (dequantized)
    and every encoder Linear the reference's own."""
    cfg = QuantConfig(bits=bits, group_size=64, quantize_embeddings=True)
    student = quant_learned._dense(quantize.quantize_module(model.module, cfg, "native")[0])
    mods = dict(model.module.named_modules())
    for p in activations.target_linears(student):
        activations.set_module(student, p, mods[p])
    return student


def _held_out_inference_kl(model, student, fit, n_valid):
    """Mean KL(p_ref ‖ p_student) at temperature 1 over the last ``n_valid`` rows of ``fit``
    (DWQ's held-out slice), both through the inference forward, in float64."""
    held = fit.subset(np.arange(len(fit) - n_valid, len(fit)))
    batches, _ = model.prepare(held, 4)
    valid = np.asarray(held.option_mask, bool)
    ones = np.ones(len(held), np.float32)
    p = masked_softmax(model.raw_logits(held, batches), valid, ones).astype(np.float64)
    q = masked_softmax(model.replace_module(student).raw_logits(held, batches), valid,
                       ones).astype(np.float64)
    return np.where(valid, p * (np.log(np.maximum(p, 1e-30)) - np.log(np.maximum(q, 1e-30))),
                    0.0).sum(axis=1).mean()


def test_dwq_student_carries_the_tables_it_does_not_learn(choice_model):
    """With a 3-bit round-to-nearest word embedding table in the given ``module``, the held-out
    KL before training is that table's (the reference's own module: ~0, the differentiable
    forward against the inference one)."""
    fit = _choice_fit(8)
    student = _tables_only_student(choice_model)
    _, _, plain = dwq.distill(choice_model, {}, fit, epochs=1, batch_size=4, learning_rate=0.0)
    _, _, emb = dwq.distill(choice_model, {}, fit, epochs=1, batch_size=4, learning_rate=0.0,
                            module=student)
    # measured: 4e-11 and 0.0063
    assert abs(plain["kl_before"]) < 1e-6
    assert emb["kl_before"] > 1e-3, emb["kl_before"]
    assert not emb["trained_scales_kept"]  # a zero step changes nothing: the start returns


def test_dwq_cosine_readout_scores_against_the_students_own_options(choice_model):
    """The variant embeds the option texts with its own (quantized) module, so DWQ's held-out KL
    is the variant's: with a 3-bit word embedding table and a zero step it equals the KL of the
    inference forward of that module against the reference (measured: 0.0135; against the
    reference's option embeddings it was 0.0039)."""
    fit = _choice_fit(16)
    student = _tables_only_student(choice_model)
    _, _, f = dwq.distill(choice_model, {}, fit, epochs=1, batch_size=4, learning_rate=0.0,
                          hidden_weight=0.0, module=student)
    kl = _held_out_inference_kl(choice_model, student, fit, f["valid_texts"])
    assert kl > 1e-3
    np.testing.assert_allclose(f["kl_before"], kl, rtol=1e-3)


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
    kl = _held_out_inference_kl(model, dense, fit, f0["valid_texts"])
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
