"""The prepacked integer GEMM (qkernel/int8_prepack.h): oneDNN's matmul primitive on a weight
reordered once into a blob, against exact NumPy int64 products (bit for bit) over odd shapes,
the scheme that keeps them exact on CPUs without VNNI (two 7-bit halves; one oneDNN GEMM
saturates there, checked), 
row counts changing between calls on the same blob, two MLX streams on one blob at once; the
W8A8 Linear and the fused BERT int8 layer bit-identical with and without the blobs, and the
kernel names that say which ran."""

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.runtime import int8_linear, qkernel


@pytest.fixture(scope="module")
def k8():
    mod = qkernel.load()
    if (mod is None or not mod.has_dnnl() or not mod.has_prepack()
            or mod.int8_prepack_bytes(96, 384) == 0):  # oneDNN has no such primitive on this CPU
        pytest.skip("oneDNN's prepacked int8 matmul unavailable here (apt-get install "
                    "libdnnl-dev, then python -m variants.runtime.qkernel --force)")
    return mod


def _operands(rng, m, k, n):
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    if m and n:
        b[0, :] = -128  # extremes: the largest products
        a[0, :] = 255
    return a, b


def _exact(a, b):
    return a.astype(np.int64) @ b.astype(np.int64).T


def test_the_scheme_follows_onednn_s_isa_and_one_gemm_saturates_without_vnni(k8):
    """oneDNN's u8 x s8 kernels without VNNI (AVX2, AVX-512 without VNNI; ONEDNN_MAX_CPU_ISA
    caps a newer CPU there: tests/runtime/test_isa_matrix.py) sum product pairs in saturating
    16-bit lanes: all codes 255 times all weights 127 gives 32 pairs of 64770 clipped to 32767
    per row element of K = 64 (1,048,544 against the exact 2,072,640). The W8A8 ops' GEMM is
    exact on every ISA; one GEMM without the split is wrong exactly where the scheme splits."""
    isa, scheme = k8.int8_cpu_isa(), k8.int8_scheme()
    vnni = isa in ("avx2_vnni", "avx512_core_vnni", "avx512_core_bf16", "avx512_core_amx")
    assert scheme == ("u8s8" if vnni else "u8s8-split7"), (isa, scheme)
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap in ("AVX2", "AVX512_CORE"):  # the cap took effect (an AVX2-only CPU stays AVX2)
        assert isa in {"AVX2": ("avx2",), "AVX512_CORE": ("avx512_core", "avx2")}[cap]
        assert scheme == "u8s8-split7"
    assert int8_linear.scheme() == scheme and int8_linear.cpu_isa() == isa
    a, b = np.full((24, 64), 255, np.uint8), np.full((64, 64), 127, np.int8)
    one = np.array(k8.int8_gemm(mx.array(a), mx.array(b), one_gemm=True))
    if scheme == "u8s8":
        np.testing.assert_array_equal(one, np.full((24, 64), 2_072_640))
    else:  # saturated: at most 32 x 32767 (measured: exactly that on AVX2 and AVX-512)
        assert (one <= 1_048_544).all(), one
    for packed in (None, k8.int8_prepack(mx.array(b))):
        np.testing.assert_array_equal(np.array(k8.int8_gemm(mx.array(a), mx.array(b), packed)),
                                      np.full((24, 64), 2_072_640))


@pytest.mark.parametrize("k, n", [(1, 1), (33, 5), (384, 384), (1536, 97), (384, 1536)])
def test_prepacked_equals_numpy_int64_as_rows_change(k8, k, n):
    """One blob, calls at row counts 24, 1, 130, 7, then 24 again (a primitive per count)."""
    rng = np.random.default_rng(k * 7 + n)
    b = _operands(rng, 1, k, n)[1]
    blob = k8.int8_prepack(mx.array(b))
    assert blob.dtype == mx.uint8 and blob.ndim == 1
    refused = k8.int8_prepack_refusals()
    for m in (24, 1, 130, 7, 24, 600):  # 600: above the prepacked cut, dnnl_gemm_u8s8s32
        a = _operands(rng, m, k, n)[0]
        got = np.array(k8.int8_gemm(mx.array(a), mx.array(b), packed=blob))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, _exact(a, b))
        # and the plain dnnl_gemm_u8s8s32 path: the same int32 sums
        np.testing.assert_array_equal(got, np.array(k8.int8_gemm(mx.array(a), mx.array(b))))
    assert k8.int8_prepack_refusals() == refused  # every call ran the prepacked primitive


def test_two_streams_on_one_blob_at_once(k8):
    """Two MLX CPU streams (two threads) run the same primitive on the same blob in the same
    evaluation: each has its own scratchpad, so each sum is exact."""
    rng = np.random.default_rng(5)
    b = _operands(rng, 1, 1536, 384)[1]
    blob = k8.int8_prepack(mx.array(b))
    mx.eval(blob)
    streams = [mx.new_stream(mx.cpu) for _ in range(2)]
    ins = [[_operands(rng, 96, 1536, 384)[0] for _ in range(16)] for _ in streams]
    outs = []
    for s, xs in zip(streams, ins):
        with mx.stream(s):
            outs.append([k8.int8_gemm(mx.array(a), mx.array(b), packed=blob) for a in xs])
    mx.eval(outs)
    for xs, ys in zip(ins, outs):
        for a, y in zip(xs, ys):
            np.testing.assert_array_equal(np.array(y), _exact(a, b))


def test_a_blob_of_another_weight_shape_is_refused(k8):
    blob = k8.int8_prepack(mx.zeros((16, 32), mx.int8))
    a, b = mx.zeros((2, 32), mx.uint8), mx.zeros((200, 32), mx.int8)
    with pytest.raises(ValueError, match="packed must be int8_prepack"):
        k8.int8_gemm(a, b, packed=blob)
    with pytest.raises(ValueError, match="wq must be int8"):
        k8.int8_prepack(mx.zeros((4, 4), mx.float32))


def test_a_foreign_blob_falls_back_to_the_plain_gemm(k8):
    """A blob whose header names another shape of the same byte count is not used: the call
    runs dnnl_gemm_u8s8s32 on the plain weight (exact sums) and counts one refusal."""
    rng = np.random.default_rng(3)
    a, b = _operands(rng, 5, 64, 64)
    blob = np.array(k8.int8_prepack(mx.array(b)))
    blob[8] ^= 1  # the header's N
    before = k8.int8_prepack_refusals()
    got = np.array(k8.int8_gemm(mx.array(a), mx.array(b), packed=mx.array(blob)))
    np.testing.assert_array_equal(got, _exact(a, b))
    assert k8.int8_prepack_refusals() == before + 1


def _linear(n_in, n_out, seed):
    mx.random.seed(seed)
    lin = nn.Linear(n_in, n_out)
    mx.eval(lin.parameters())
    return lin


def test_linear_is_bit_identical_with_and_without_the_blob(k8, monkeypatch):
    q = int8_linear.Int8Linear(_linear(384, 96, 2), native=True)
    assert q.kernel == "int8-matmul-dnnl-prepacked"
    assert "_prepack" not in dict(q.parameters())  # the blob is not a parameter (not saved)
    rng = np.random.default_rng(1)
    for rows in (1, 24, 77):
        x = mx.array(rng.normal(size=(rows, 384)).astype(np.float32))
        fast = np.array(q(x))
        with monkeypatch.context() as mp:
            mp.setattr(int8_linear, "can_prepack", lambda wq: False)  # no blob
            assert q.kernel == "int8-gemm-dnnl"
            plain = np.array(q(x))
        np.testing.assert_array_equal(fast, plain)
    # weights replaced (negated): the next call packs them anew, it does not reuse the old blob
    before = np.array(q(x))
    q.wq, q.colsum = -q["wq"], -q["colsum"]
    after = np.array(q(x))
    with monkeypatch.context() as mp:
        mp.setattr(int8_linear, "can_prepack", lambda wq: False)
        np.testing.assert_array_equal(after, np.array(q(x)))
    assert np.abs(after - before).max() > 0.1


def test_a_k_whose_sums_can_leave_int32_is_refused(k8):
    """255 x 128 x K < 2^31 up to K = 65793: beyond that an int32 sum (or zp x colsum) could
    wrap, so the ops refuse it rather than return other sums."""
    a, b = mx.zeros((1, 65794), mx.uint8), mx.zeros((2, 65794), mx.int8)
    with pytest.raises(ValueError, match="K = 65794 inputs; int32 sums are exact up to 65793"):
        k8.int8_gemm(a, b)
    with pytest.raises(ValueError, match="K = 65794 inputs"):
        k8.int8_linear(mx.zeros((1, 65794)), b, mx.ones((2,)), mx.zeros((2,), mx.int32))
    ok = k8.int8_gemm(mx.full((1, 65793), 255, mx.uint8), mx.full((1, 65793), -128, mx.int8))
    assert int(np.array(ok)[0, 0]) == 255 * -128 * 65793  # the last K that fits, exact
