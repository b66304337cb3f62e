"""Every family on every architecture: quant, low rank, pruning and early exit build and
run on the tiny random-init RoBERTa, ModernBERT, MPNet and DeBERTa-v3 / -v2 checkpoints
(tests/fixtures/hf/, ModernBERT with global attention every 3rd and every 2nd layer) wrapped in a classifier decision module (the
checkpoint's own head); ρ = 1 pruning (bit for bit; ρ = 0.9999, which keeps every token through
the gather path, to round-off), a never-firing exit rule and full-rank factors reproduce the
model's logits to round-off; the rows an exit rule keeps are the model's own logits; a module
whose readout needs token positions (marker model) is refused in one line; student, DWQ and
output selection refuse MPNet and DeBERTa in one line."""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.families import get_family
from variants.families.lowrank import build as lr
from variants.families.exit.family import ExitConfig
from variants.families.exit.net import ExitNet
from variants.families.exit.rules import fires, rule_statistic
from variants.families.family import BuildInputs
from variants.families.lowrank.family import LowRankConfig
from variants.families.prune.family import PruneConfig
from variants.families.quant.build import QuantConfig
from variants.checkpoints.load import load_checkpoint
from variants.models.decision import DecisionModel
from variants.arch.encoder import mean_pool
from variants.datasets.tasks import build_taskset

HF = Path(__file__).parents[1] / "fixtures" / "hf"
ARCHS = ["roberta", "modernbert", "modernbert_g2", "distilbert", "electra", "albert",
         "mpnet", "deberta_v3", "deberta_v2"]
TEXTS = ["Honestly the best pasta I have had in years, and the staff were lovely.",
         "The soup was cold.", "ok", "It is a restaurant on the corner of the main street.",
         "Never again. Rude, slow, and the bill was wrong twice!", "Fine, I guess.",
         "What a wonderful surprise to find this place open so late at night.", "meh",
         # longer than modernbert_g2's window (|q - k| <= 32): pruning keeps the distances
         " ".join(["The first course was late but the second one was worth the wait,"] * 6)]


class ClassifierNet(nn.Module):
    """The shape of the lead's ClassifierNet: the checkpoint's own sequence-classification head
    on the encoder's last hidden states, plus the ``readout`` the families call."""

    def __init__(self, encoder, classifier):
        super().__init__()
        self.encoder = encoder
        self.classifier = classifier

    def __call__(self, input_ids, attention_mask, token_type_ids):
        return self.readout(self.encoder(input_ids, attention_mask, token_type_ids).last_hidden,
                            attention_mask)

    def readout(self, last_hidden, attention_mask):
        return self.classifier(last_hidden, attention_mask)


class MarkerNet(ClassifierNet):
    """A marker-style module: its readout needs the marker token positions."""

    def readout(self, last_hidden, attention_mask, marker_pos):
        return mx.take_along_axis(last_hidden, marker_pos[..., None], axis=1).sum(-1)


class ClassifierModel(DecisionModel):
    name = "tiny-classifier"
    exit_head_kind = "linear"

    def forward(self, batch):
        return self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids)


def _taskset(texts, offset=0):
    rows = [dict(id=f"t{offset + i}", task="c3", text=t, options=["neg", "neu", "pos"],
                 scores=[-1.0, 0.0, 1.0], actions=["a", "b", "c"], label=i % 3, human=None)
            for i, t in enumerate(texts)]
    return build_taskset(rows, k_max=3, action_names=("a", "b", "c"))


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    ckpt = load_checkpoint(HF / request.param)
    model = ClassifierModel(ClassifierNet(ckpt.encoder, ckpt.classifier), ckpt.tokenizer,
                            temperatures={3: 1.0})
    encs, _ = ckpt.tokenizer.encode(TEXTS)
    batch = tuple(mx.array(a) for a in ckpt.tokenizer.batch(encs))
    assert not np.array(batch[1]).all()  # the batch has padding
    ref = np.array(model.module(*batch))
    inputs = BuildInputs(calibration=_taskset(TEXTS), fit=_taskset(TEXTS[::-1] + TEXTS, 100))
    return request.param, model, batch, ref, inputs


def _run(variant, batch):
    out = np.array(variant.module(*batch))
    assert np.isfinite(out).all()
    return out


def test_prune_full_ratio_reproduces_and_half_ratio_shortens(setup):
    _, model, batch, ref, inputs = setup
    fam = get_family("prune")
    full, info = fam.build(model, PruneConfig(after_layer=1, keep_ratio=1.0), inputs)
    assert (_run(full, batch) == ref).all()  # ρ = 1 runs the reference's own forward
    # ρ just below 1 still keeps every token (⌈ρ·n⌉ = n) but through the gather path
    near, _ = fam.build(model, PruneConfig(after_layer=1, keep_ratio=0.9999), inputs)
    assert np.abs(_run(near, batch) - ref).max() <= 1e-5
    half, info = fam.build(model, PruneConfig(schedule=((1, 0.7), (2, 0.4))), inputs)
    trace = []
    out, ids, kept = half.module.forward_trace(*batch, trace=trace)
    n_real = np.array(batch[1]).sum(1)
    want = np.maximum(np.ceil(0.4 * n_real - 1e-6), 2)  # + the start/end floor
    np.testing.assert_array_equal(np.array(kept).sum(1), np.minimum(want, n_real))
    assert trace[2][1][1] < trace[1][1][1] < trace[0][1][1] == batch[0].shape[1]
    start, end = info["protected_ids"]
    assert (np.array(ids)[:, 0] == start).all()  # [CLS] / <s> kept first
    assert np.isfinite(np.array(out)).all() and np.abs(np.array(out) - ref).max() > 1e-6


def test_exit_never_firing_rule_reproduces(setup):
    _, model, batch, ref, _ = setup
    enc = model.module.encoder
    D, n = enc.args.hidden_size, len(enc.layers)
    heads = [nn.Linear(D, 3) for _ in range(n - 1)]
    for h in heads:  # uniform probabilities: margin 0, never above 0.5 (not known statically)
        h.weight, h.bias = mx.zeros((3, D)), mx.zeros((3,))
    net = ExitNet(model.module, heads, range(1, n), "margin", 0.5)
    out = np.array(net(*batch))
    assert net.heads_run == n - 1 and (net.last_exit_layer == n).all()
    assert np.abs(out - ref).max() <= 1e-5


def test_exit_rows_that_stay_are_the_models_own(setup):
    _, model, batch, ref, _ = setup
    enc = model.module.encoder
    D, n = enc.args.hidden_size, len(enc.layers)
    head = nn.Linear(D, 3)
    head.weight = mx.array(np.random.default_rng(0).normal(0, 8, (3, D)).astype(np.float32))
    h1 = enc(*batch, output_hidden_states=True).hidden_states[1]
    z = np.array(head(mean_pool(h1, batch[1])))
    stat = rule_statistic(z, "margin", None, None)
    # tau halfway between two rows' statistics: a row exactly at tau (the median of 9) could
    # fall either side on float32 round-off between the padded and the packed forward
    srt = np.sort(stat)
    tau = float(srt[len(srt) // 2 - 1] + srt[len(srt) // 2]) / 2
    go = fires(stat, "margin", tau)
    assert 0 < go.sum() < len(go)  # some rows leave after layer 1, the rest run on
    net = ExitNet(model.module, [head], [1], "margin", tau)
    out = np.array(net(*batch))
    np.testing.assert_array_equal(net.last_exit_layer, np.where(go, 1, n))
    np.testing.assert_allclose(out[go], z[go], atol=1e-5)
    assert np.abs(out[~go] - ref[~go]).max() <= 1e-5


def test_exit_build_runs(setup):
    _, model, batch, ref, inputs = setup
    variant, info = get_family("exit").build(model, ExitConfig(rule="margin", target=0.9),
                                              inputs)
    assert info["head_kind"] == "linear" and info["n_layers"] == len(model.module.encoder.layers)
    out = _run(variant, batch)
    stay = variant.module.last_exit_layer == info["n_layers"]
    assert np.abs(out[stay] - ref[stay]).max(initial=0) <= 1e-5


def test_lowrank_full_rank_reproduces_and_targets_the_architecture(setup, monkeypatch):
    arch, model, batch, ref, inputs = setup
    fam = get_family("lowrank")
    names = (("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo") if arch.startswith("modernbert") else
             ("intermediate", "output", "attention.query", "attention.key", "attention.value",
              "attention.out"))  # BERT's order as on MiniLM (build.json tables unchanged)
    monkeypatch.setattr(lr, "break_even", lambda m, n: float("inf"))  # factorise every layer
    lr._FACTORED.clear()
    variant, info = fam.build(model, LowRankConfig(method="whitened", rule="rank", rank=64),
                              inputs)
    paths = [r["path"] for r in info["layers"]]
    assert paths[:len(names)] == [f"encoder.layers.0.{s}" for s in names]
    assert len(paths) == len(names) * len(model.module.encoder.layers)
    assert not any(r["dense"] for r in info["layers"])
    assert info["calibration_tokens"] == int(sum(len(e.ids) for e in
                                                 model.tokenizer.encode(TEXTS)[0]))
    assert np.abs(_run(variant, batch) - ref).max() <= 1e-4
    monkeypatch.undo()
    lr._FACTORED.clear()
    small, info = fam.build(model, LowRankConfig(method="whitened", ratio=0.5), inputs)
    assert info["factorised_layers"] > 0
    assert np.abs(_run(small, batch) - ref).max() > 1e-6


def test_quant_runs(setup):
    _, model, batch, ref, inputs = setup
    variant, info = get_family("quant").build(model, QuantConfig(bits=8, group_size=32), inputs)
    assert 0 < np.abs(_run(variant, batch) - ref).max() < 0.5


@pytest.mark.parametrize("family", ["prune", "exit"])
def test_marker_or_headless_module_is_refused_in_one_line(setup, family):
    _, model, _, _, inputs = setup
    marker = MarkerNet(model.module.encoder, model.module.classifier)
    cfg = PruneConfig() if family == "prune" else ExitConfig()
    with pytest.raises(ValueError, match="MarkerNet.readout needs marker_pos") as e:
        get_family(family).check_model(marker, [cfg])
    assert "\n" not in str(e.value) and f"--family {family}" in str(e.value)
    with pytest.raises(ValueError, match="MarkerNet.readout needs marker_pos"):
        get_family(family).build(model.replace_module(marker), cfg, inputs)
    bare = nn.Module()
    bare.encoder = model.module.encoder
    with pytest.raises(ValueError, match=r"Module has no readout\(last_hidden, attention_mask\)"):
        get_family(family).check_model(bare, [cfg])
    get_family(family).check_model(model.module, [cfg])  # the classifier module passes


def test_embedding_model_prunes_and_exits_on_modernbert():
    """minilm-choice's EmbeddingNet (cosine logits against option texts) on ModernBERT: ρ = 1
    pruning reproduces it, the cosine exit heads build and the rows that stay are its own."""
    from variants.models.choice import ChoiceModel, EmbeddingNet

    ckpt = load_checkpoint(HF / "modernbert_g2")
    model = ChoiceModel(EmbeddingNet(ckpt.encoder), ckpt.tokenizer, temperatures={3: 1.0})
    cal, fit = _taskset(TEXTS), _taskset(TEXTS[::-1] + TEXTS, 100)
    ref = model.raw_logits(cal)
    pruned, _ = get_family("prune").build(model, PruneConfig(after_layer=2, keep_ratio=1.0),
                                          BuildInputs(calibration=cal))
    assert (pruned.raw_logits(cal) == ref).all()  # ρ = 1 runs the reference's own forward
    near, _ = get_family("prune").build(model, PruneConfig(after_layer=2, keep_ratio=0.9999),
                                        BuildInputs(calibration=cal))
    assert np.abs(near.raw_logits(cal) - ref).max() <= 1e-4  # 20·cos: logits scale 20
    variant, info = get_family("exit").build(model, ExitConfig(rule="margin", target=0.9),
                                             BuildInputs(calibration=cal, fit=fit))
    out = variant.raw_logits(cal)
    assert info["head_kind"] == "cosine" and np.isfinite(out).all()
    stay = variant.last_exit_layer == info["n_layers"]
    assert np.abs(out[stay] - ref[stay]).max(initial=0) <= 1e-4


def test_w8a8_runs_on_every_architecture(setup):
    """W8A8 (plain and SmoothQuant) on RoBERTa and ModernBERT: every encoder Linear runs in int8,
    native and simulated agree, and the logits move by a W8A8-sized amount (not 0, not far)."""
    from variants.families.w8a8.build import Int8Linear
    from variants.families.w8a8.family import W8A8Config

    arch, model, batch, ref, inputs = setup
    fam = get_family("w8a8")
    n_linear = sum(1 for p, m in model.module.named_modules()
                   if type(m) is nn.Linear and p.startswith("encoder.layers."))
    outs = {}
    for smooth in (False, True):
        for mode in ("simulated", "native"):
            v, info = fam.build(model, W8A8Config(smooth=smooth), inputs.only(fam.inputs), mode)
            assert info["int8_layers"] == n_linear > 0
            assert sum(isinstance(m, Int8Linear) for _, m in v.module.named_modules()) == n_linear
            outs[smooth, mode] = _run(v, batch)
    for smooth in (False, True):
        d = np.abs(outs[smooth, "simulated"] - ref).max()
        assert 0 < d <= 0.1 * np.abs(ref).max() + 1e-3, (arch, smooth, d)
        # a per-token code may round the other way where an upstream round-off moved its input
        # across a code boundary (the layer-level test checks identical codes): inside W8A8's
        # own error on these tiny random models (DeBERTa-v3's is small, 3.4e-4, against one
        # row's flip of 2.4e-4)
        gap = np.abs(outs[smooth, "native"] - outs[smooth, "simulated"]).max()
        assert gap <= d, (arch, smooth, gap, d)


def test_families_that_train_through_bert_layers_refuse_relative_position_layers(setup):
    """Student, DWQ and output selection compute BERT's layer without MPNet's position bias or
    DeBERTa's disentangled scores: on those architectures each refuses in one line naming the
    layer and the alternative (they run on RoBERTa and refuse ModernBERT alike)."""
    from variants.families.exact.outsel import reads_of
    from variants.families.quant.dwq import check_model as dwq_check
    from variants.families.student.build import check_model as student_check
    from variants.families.student.family import StudentConfig

    arch, model, *_ = setup
    if arch not in ("mpnet", "deberta_v3", "deberta_v2"):
        pytest.skip("BERT layers train; ModernBERT's refusals are tested in their own files")
    layer = type(model.module.encoder.layers[0]).__name__
    checks = ((lambda: student_check(model.module, [StudentConfig(layers=1)]),
               f"--family student trains BERT / RoBERTa encoder layers; this model's are {layer}"),
              (lambda: dwq_check(model.module),
               f"--quant-method dwq trains through BERT / RoBERTa encoder layers and this model "
               f"has {layer}"),
              (lambda: reads_of(model.module),
               "--exact-kinds outsel runs BERT/RoBERTa encoders only, not "
               f"{type(model.module.encoder).__name__}"))
    for check, start in checks:
        with pytest.raises(ValueError) as e:
            check()
        assert str(e.value).startswith(start) and "\n" not in str(e.value), str(e.value)
