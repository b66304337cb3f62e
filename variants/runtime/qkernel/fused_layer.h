// What fused_layer.cpp (the compiled post-norm BERT layer) shares with fused_qlayer.cpp (the
// same layer on quantized weights) and qkernel.cpp (the dequantizer): the layer's arguments and
// its entry point (mlx-variants, variants/qkernel).
#pragma once

#include <cstddef>
#include <cstdint>

// OpenBLAS (preloaded by variants/_blas.py before MLX): the one BLAS call the kernels make
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float* a, int lda, const float* b, int ldb,
                            float beta, float* c, int ldc);

namespace mlx::core {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS enum values

// One affine-quantized projection (mx.quantize's packing, see qkernel.cpp): rows of `in`
// values, `bits` per value, one scale and bias per `group_size` values, both stored as
// `stype` (kScaleF32 float32, kScaleF16 float16, kScaleBF16 bfloat16).
constexpr int kScaleF32 = 0, kScaleF16 = 1, kScaleBF16 = 2;
struct QProj {
  const uint8_t *w, *w_end;
  const void *scales, *biases;
  int64_t in;
  int group_size, bits;
  int stype = kScaleF32;
};

// rows [r0, r1) of a quantized weight into dst (row stride in), bit-identical to
// mx.dequantize (qkernel.cpp; AVX2 or portable loop)
void qk_dequant(const QProj& q, float* dst, int64_t r0, int64_t r1);
// rows [r0, r1) (multiples of 16) as 16-column panels of W^T (panel_gemm.h's layout: panel
// (r - r0) / 16 at dst + (r - r0) * in, each (in, 16) contiguous), the same values as
// qk_dequant; tmp: 16 * in floats (fused_qlayer.cpp; AVX2 only)
void qk_dequant_panels(const QProj& q, float* dst, int64_t r0, int64_t r1, float* tmp);

// The layer's arrays. Folded fp32 weights (fused_layer.cpp's op): w_* are (K, N) row-major
// (w_qkv (D, 3D) with 1/sqrt(head_dim) in the query part, b_k = b_v = null, qw = null).
// Quantized (fused_qlayer.cpp's op, qw = the six projections query, key, value, out,
// intermediate, output): w_* all point at one scratch buffer `wbuf` into which each phase part
// dequantizes the output rows it computes, (N, K) row-major (q|k|v rows stacked: (3D, D)),
// multiplied transposed; q = (x Wq^T + b_q) * q_scale, k and v with their own biases.
struct FusedArgs {
  const float *x, *kb, *w_qkv, *b_q, *w_o, *b_o, *g1, *be1, *w_i, *b_i, *w_u, *b_u, *g2, *be2;
  const float *p_qkv, *p_o, *p_i, *p_u;  // the weights as 16-column panels, or all null
  float *y, *qkv, *ctx, *h, *inter, *scores;  // scores: lmax^2 floats per part
  const int* lens;
  int n_seqs, rows, d, f, heads, act, lmax;
  bool avx2;
  float eps1, eps2;
  const QProj* qw = nullptr;  // 6 quantized projections, or null (folded fp32 weights)
  float* wbuf = nullptr;      // the dequantized rows (max(3D, F) x D floats)
  const float *b_k = nullptr, *b_v = nullptr;
  float q_scale = 1.0f;
  bool qpanels = false;    // quantized: wbuf holds 16-column panels (panel_gemm), not (N, K)
  float* qtmp = nullptr;   // qpanels: 16 * max(D, F) floats per part
};

// The layer's activation scratch, one buffer: q|k|v (rows x 3D), ctx, h (rows x D each),
// inter (rows x F), then each part's lmax x lmax scores. Its size in floats:
inline size_t fused_act_floats(int rows, int d, int f, int lmax, int parts) {
  return size_t(rows) * (5 * size_t(d) + f) + size_t(parts) * lmax * lmax;
}
// ... and a's five pointers into it (a.rows, a.d, a.f set)
inline void fused_set_acts(FusedArgs& a, float* w) {
  const size_t n = size_t(a.rows);
  a.qkv = w;
  a.ctx = w + n * 3 * a.d;
  a.h = w + n * 4 * a.d;
  a.inter = w + n * 5 * a.d;
  a.scores = w + n * (5 * size_t(a.d) + a.f);
}

// the layer, in one part or split in two over fused_layer.cpp's helper thread (parts >= 2)
void fused_run_layer(const FusedArgs& a, int parts);
// whether the AVX2+FMA loops may run (CPU support and fused_allow_avx2)
bool fused_use_avx2();

}  // namespace mlx::core
