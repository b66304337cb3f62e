"""Token-pruning builder: ρ = 1 is exact, protected tokens stay, sequences really
shorten, order kept, cost model, composition with quantization, bad input."""

import mlx.core as mx
import numpy as np
import pytest

from variants.datasets import bundled as data
from variants.families.prune import build as prune, family as prune_family
from variants.families.prune.family import PruneConfig
from variants.cli import main
from variants.models import choice, sentiment

TEXTS = ["Honestly the best pasta I have had in years, but the waiter was rude and slow.",
         "The soup was cold.", "It is a restaurant.", "Not bad at all!"]


@pytest.fixture(scope="module")
def model(checkpoint):
    m = sentiment.build(checkpoint)  # untrained head: still a fixed linear map of the embedding
    rng = np.random.default_rng(0)
    m.module.head.weight = mx.array(rng.normal(size=(3, 384)).astype(np.float32) * 5)
    return m


@pytest.fixture(scope="module")
def batch(checkpoint):
    encs, _ = checkpoint.tokenizer.encode(TEXTS)
    return tuple(mx.array(a) for a in checkpoint.tokenizer.batch(encs))


@pytest.mark.parametrize("score", prune_family.SCORES)
def test_keep_ratio_one_reproduces_reference(model, batch, score):
    variant, info = prune.build(model, PruneConfig(after_layer=2, keep_ratio=1.0, score=score))
    ref = np.array(model.module(*batch))
    out = np.array(variant.module(*batch))
    assert (out == ref).all()  # bit-identical: ρ = 1 runs the reference's own forward
    assert info["work_ratio"] == 1.0 and info["ideal_speedup"] == 1.0


def test_keep_ratio_one_reproduces_choice_embeddings(checkpoint, batch):
    m = choice.build(checkpoint)
    variant, _ = prune.build(m, PruneConfig(after_layer=3, keep_ratio=1.0))
    assert (np.array(variant.module(*batch)) == np.array(m.module(*batch))).all()


def test_keep_ratio_one_outputs_equal_reference_through_the_decision_model(model, checkpoint):
    """The judged logits (prepared batches, packing, the decision model's forward) of the ρ = 1
    control equal the reference's exactly, as the README's "identical outputs" claims."""
    frame = data.split_frame(data.load_vader(), "eval")
    tasks = sentiment.make_taskset(data.sample(frame, 40, seed=1))
    variant, _ = prune.build(model, PruneConfig(after_layer=3, keep_ratio=1.0))
    ref, out = model.raw_logits(tasks), variant.raw_logits(tasks)
    assert ref.shape == (40, 3) and (np.asarray(out) == np.asarray(ref)).all()


def test_sequence_is_shorter_and_protected_tokens_and_order_kept(model, batch, checkpoint):
    ids, mask, types = batch
    variant, info = prune.build(model, PruneConfig(after_layer=2, keep_ratio=0.3))
    trace = []
    out, kept_ids, kept_mask = variant.module.forward_trace(ids, mask, types, trace=trace)
    L = ids.shape[1]
    assert [s[1] for _, s in trace[:2]] == [L, L]  # layers 1-2 see the full batch
    n_real = np.array(mask).sum(1)
    n_keep = np.maximum(prune.keep_counts(n_real, 0.3), 2)
    assert all(s[1] == n_keep.max() < L for _, s in trace[2:])  # layers 3-6 see fewer tokens
    np.testing.assert_array_equal(np.array(kept_mask).sum(1), n_keep)
    cls, sep = prune.protected_ids(checkpoint.tokenizer)
    ids_np, kept_np, km = np.array(ids), np.array(kept_ids), np.array(kept_mask).astype(bool)
    for i in range(len(TEXTS)):
        kept = kept_np[i][km[i]].tolist()
        assert kept[0] == cls and kept[-1] == sep  # protected, and still first / last
        orig = ids_np[i][: n_real[i]].tolist()
        it = iter(orig)
        assert all(t in it for t in kept)  # a subsequence: original order preserved
    assert out.shape == (len(TEXTS), 3) and np.isfinite(np.array(out)).all()


def test_protected_tokens_survive_the_smallest_ratio(model, batch, checkpoint):
    ids, mask, types = batch
    variant, _ = prune.build(model, PruneConfig(after_layer=1, keep_ratio=0.01, score="cls"))
    _, kept_ids, kept_mask = variant.module.forward_trace(ids, mask, types)
    cls, sep = prune.protected_ids(checkpoint.tokenizer)
    kept = np.where(np.array(kept_mask) > 0, np.array(kept_ids), -1)
    for row in kept:
        assert sorted(t for t in row.tolist() if t >= 0) == sorted([cls, sep])


def test_schedule_prunes_twice(model, batch):
    ids, mask, types = batch
    cfg = PruneConfig(schedule=((2, 0.7), (4, 0.4)))
    assert cfg.name == "prune-s2x0.70-4x0.40"
    variant, info = prune.build(model, cfg)
    trace = []
    variant.module.forward_trace(ids, mask, types, trace=trace)
    lengths = [s[1] for _, s in trace]
    assert lengths[0] == lengths[1] > lengths[2] == lengths[3] > lengths[4] == lengths[5]
    assert info["work_ratio"] == pytest.approx((2 + 2 * 0.7 + 2 * 0.4) / 6)


def test_importance_received_averages_over_heads_and_real_queries():
    attn = mx.array(np.random.default_rng(0).dirichlet(np.ones(4), size=(1, 2, 4)), mx.float32)
    mask = mx.array([[1, 1, 1, 0]])
    got = np.array(prune.importance(attn, mask, "received"))
    want = np.array(attn)[0].mean(0)[:3].mean(0)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    np.testing.assert_allclose(np.array(prune.importance(attn, mask, "cls"))[0],
                               np.array(attn)[0, :, 0].mean(0), rtol=1e-6)


def test_work_ratio_cost_model():
    assert prune.work_ratio([(2, 0.5)], 6) == pytest.approx(2 / 6 + (1 - 2 / 6) * 0.5)
    r = prune.realised_work_ratio([(3, 0.5)], 6, np.array([10, 4]), np.array([2, 2]))
    assert r == pytest.approx((3 * 14 + 3 * (5 + 2)) / (6 * 14))


def test_composes_with_quantization(model, batch):
    variant, info = prune.build(model, PruneConfig(after_layer=2, keep_ratio=1.0, bits=8))
    assert info["quant"]["quantized_layers"] > 0 and variant.name == model.name
    np.testing.assert_allclose(np.array(variant.module(*batch)), np.array(model.module(*batch)),
                               atol=0.5)
    assert PruneConfig(bits=4).name == "prune-a2-r0.50-q4"


def test_ladder_names_encode_parameters():
    names = [c.name for c in prune_family.ladder(prune_layers=[2], keep_ratios=[0.5, 0.3],
                                          prune_scores=["received", "cls"])]
    assert names == ["prune-a2-r0.50", "prune-a2-r0.50-cls", "prune-a2-r0.30",
                     "prune-a2-r0.30-cls"]
    assert prune_family.run_name(prune_scores=["received"]) == "grid-received"


def test_names_never_round_two_ratios_together():
    # .2f used to name 0.7 and 0.705 both r0.70 (one variant silently dropped)
    names = [c.name for c in prune_family.ladder(prune_layers=[2], keep_ratios=[0.7, 0.705, 0.5])]
    assert names == ["prune-a2-r0.70", "prune-a2-r0.705", "prune-a2-r0.50"]
    assert PruneConfig(schedule=((2, 0.705), (4, 0.4))).name == "prune-s2x0.705-4x0.40"
    assert prune_family.name_number(1 / 3, ".2f") == repr(1 / 3)  # exact, reads back as the value
    assert [c.name for c in prune_family.ladder(prune_layers=[2, 2], keep_ratios=[0.5, 0.5])] == \
           ["prune-a2-r0.50"]  # exact repeats are one variant


def test_two_configs_with_one_name_are_refused():
    # group size is not in the name without bits: two such configs would share a folder
    with pytest.raises(ValueError, match=r"share the name 'prune-a2-r0.50'.*--prune-group-size"):
        prune_family.unique_by_name([PruneConfig(), PruneConfig(group_size=32)],
                             {"group_size": "--prune-group-size"})


@pytest.mark.parametrize("kwargs, message", [
    (dict(after_layer=0), "after_layer=0 must be an integer >= 1"),
    (dict(keep_ratio=0.0), "keep_ratio=0.0 is outside (0, 1]"),
    (dict(keep_ratio=1.5), "keep_ratio=1.5 is outside (0, 1]"),
    (dict(score="magnitude"), "importance score 'magnitude' is not known"),
    (dict(schedule=((3, 0.5), (2, 0.7))), "must be strictly increasing"),
    (dict(schedule=((2, 0.5), (3, 0.7))), "must be non-increasing"),
])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PruneConfig(**kwargs)


def test_layer_at_or_above_n_refused(model):
    with pytest.raises(ValueError, match=r"after_layer=6 is outside \[1, 6\)"):
        prune.build(model, PruneConfig(after_layer=6))


@pytest.mark.parametrize("args, message", [
    (["--prune-layers", "6"], "after_layer=6 is outside [1, 6)"),
    (["--prune-layers", "0"], "after_layer=0 must be an integer >= 1"),
    (["--keep-ratios", "0"], "keep_ratio=0.0 is outside (0, 1]"),
    (["--keep-ratios", "1.2"], "keep_ratio=1.2 is outside (0, 1]"),
    (["--prune-schedules", "2-0.5"], "--prune-schedule '2-0.5' is not 'layer:ratio"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main(["sweep", "--family", "prune", "--results-dir", str(tmp_path / "r"),
                 "--n-fit", "20", "--n-calibration", "20", "--n-eval", "20", "--no-progress",
                 "--timing-batch-sizes", "1", "16",
                 *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "r").exists()


def test_cli_unknown_score_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--family", "prune", "--prune-scores", "magnitude",
              "--results-dir", str(tmp_path / "r")])
    assert e.value.code == 2 and "magnitude" in capsys.readouterr().err


def test_realised_ratio_reported_on_calibration(model):
    frame = data.split_frame(data.load_vader(), "calibration")
    cal = sentiment.make_taskset(data.sample(frame, 16, seed=0))
    _, info = prune.build(model, PruneConfig(after_layer=2, keep_ratio=0.5), calibration=cal)
    assert info["work_ratio"] < info["calibration_work_ratio"] < 1.0
    assert info["calibration_mean_tokens_kept"] < info["calibration_mean_tokens"]
