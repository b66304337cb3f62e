"""The families that read BERT's layers directly, on DistilBERT, ELECTRA and ALBERT (BERT's
TransformerLayer under other embeddings; tests/fixtures/hf/, each checkpoint's own head, the
reference batch with a 125-128-token row): output selection's last layer at token 0 equals the
full forward's; the student's differentiable layer equals the inference layer (ALBERT: the tanh
GELU); per-layer sensitivity's suffix forward from every layer gives the whole stack's states
and the encoder keeps its class; DWQ and the student accept the encoders."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.checkpoints.load import load_checkpoint
from variants.models.classifier import ClassifierNet

HF = Path(__file__).parents[1] / "fixtures" / "hf"
ARCHS = ["distilbert", "electra", "albert"]


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    ck = load_checkpoint(HF / request.param)
    ref = np.load(HF / request.param / "reference.npz")
    batch = tuple(mx.array(ref[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    assert batch[0].shape[1] >= 125 and not np.array(batch[1]).all()
    return request.param, ClassifierNet(ck.encoder, ck.classifier), batch


def test_output_selection_equals_the_full_last_layer(setup):
    from variants.families.exact.outsel import OutputSelectNet, reads_of

    _, net, batch = setup
    assert reads_of(net) == "cls"  # each head reads token 0 only
    full = np.array(net(*batch))
    sel = np.array(OutputSelectNet(net, "cls")(*batch))
    np.testing.assert_allclose(sel, full, rtol=0, atol=1e-5)
    assert np.abs(full).max() > 0.05


def test_student_layer_equals_the_inference_layer_and_dwq_accepts(setup):
    from variants.arch.encoder import attention_bias
    from variants.families.quant import dwq
    from variants.families.student import train as st

    arch, net, batch = setup
    enc = net.encoder
    st.trainable_encoder(enc)
    dwq.check_model(net)
    x = enc.embed(batch[0], batch[2])
    ctx = enc.context(batch[1])
    real = np.array(batch[1], bool)
    for i in range(len(enc.layers)):
        want, _ = enc.apply_layer(i, x, ctx)
        got = st.plain_layer(enc.layers[i], x, attention_bias(batch[1]))
        assert np.abs(np.array(got)[real] - np.array(want)[real]).max() < 1e-4, (arch, i)
        x = want
    last, hidden = st.forward_hidden(net, *batch)
    assert len(hidden) == len(enc.layers)
    ref = np.array(enc(*batch).last_hidden)
    assert np.abs(np.array(last)[real] - ref[real]).max() < 1e-4


def test_suffix_forward_from_every_layer_equals_the_whole_stack(setup):
    from variants.search import suffix

    arch, net, batch = setup
    enc = net.encoder
    cls = type(enc)
    assert suffix.applies(net)
    cache = suffix.SuffixCache(net)
    with cache.record():
        ref = np.array(enc(*batch).last_hidden)
    real = np.array(batch[1], bool)
    n = len(enc.layers)
    for i in range(n):
        with cache.start_at(i):
            got = np.array(enc(*batch).last_hidden)
        np.testing.assert_allclose(got[real], ref[real], rtol=0, atol=2e-5)
    assert cache.hits == n and type(enc) is cls
    # a change to the last layer is seen from there, one to the first is not
    w = enc.layers[n - 1].output.weight
    enc.layers[n - 1].output.weight = w * 0
    try:
        with cache.start_at(n - 1):
            moved = np.array(enc(*batch).last_hidden)
    finally:
        enc.layers[n - 1].output.weight = w
    assert np.abs(moved[real] - ref[real]).max() > 1e-2
