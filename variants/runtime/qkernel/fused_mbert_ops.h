// ModernBERT's row loops that fused_mbert_layer.cpp (fp32 and quantized projections) and
// fused_mbert_int8layer.cpp (W8A8 projections) share: layer norm, rotary, the (windowed)
// attention per (sequence, head) (mlx-variants, variants/qkernel; the algebra: see
// fused_mbert_layer.cpp's header comment). Include after fused_common.h and fused_mbert.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace mlx::core {

namespace {

constexpr int BQ_GLOBAL = 64, BQ_LOCAL = 16;

// out = (a - mean(a)) / sqrt(var(a) + eps) * g (+ beta) over one row of d (two-pass)
FL_INLINE void layer_norm_row(const float* a, const float* g, const float* beta, float eps,
                              float* out, int d) {
  float mean = 0.0f;
#pragma omp simd reduction(+ : mean)
  for (int j = 0; j < d; ++j) mean += a[j];
  mean /= float(d);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int j = 0; j < d; ++j) {
    const float c = a[j] - mean;
    var += c * c;
  }
  const float inv = 1.0f / std::sqrt(var / float(d) + eps);
  if (beta) {
#pragma omp simd
    for (int j = 0; j < d; ++j) out[j] = (a[j] - mean) * inv * g[j] + beta[j];
  } else {
#pragma omp simd
    for (int j = 0; j < d; ++j) out[j] = (a[j] - mean) * inv * g[j];
  }
}

// src itself when g is null (layer 0's identity norm), else LN(src) into this part's buffer
FL_INLINE const float* normed(const MbArgs& a, const float* src, const float* g,
                              const float* beta, float eps, int p) {
  if (!g) return src;
  float* h = a.h + int64_t(p) * a.rows * a.d;
  for (int i = 0; i < a.rows; ++i)
    layer_norm_row(src + int64_t(i) * a.d, g, beta, eps, h + int64_t(i) * a.d, a.d);
  return h;
}

// x cos + rotate_half(x) sin on one head's row (hd values, position's table rows c, s)
FL_INLINE void rope_row(float* x, const float* c, const float* s, int hd) {
  const int m = hd / 2;
#pragma omp simd
  for (int j = 0; j < m; ++j) {
    const float u = x[j], v = x[j + m];
    x[j] = u * c[j] - v * s[j];
    x[j + m] = v * c[j + m] + u * s[j + m];
  }
}

// softmax(q k^T + kb) v for one (sequence, head): L rows at q (stride 3D), k, v; out stride D
FL_INLINE void attend(const MbArgs& a, const float* q, const float* kb, float* out, int L,
                      float* sc, float* inv) {
  const int D = a.d, D3 = 3 * D, hd = D / a.heads;
  const bool local = a.half >= 0 && L - 1 > a.half;
  // auto: where blocks of BQ_GLOBAL would reach every key anyway (L <= 2 half + BQ_GLOBAL),
  // BQ_GLOBAL (fewer, larger GEMMs), else BQ_LOCAL (fewer keys outside the window)
  const int bq = !local ? BQ_GLOBAL
                        : (a.lblock > 0 ? std::min(a.lblock, BQ_GLOBAL)
                                        : (L <= 2 * a.half + BQ_GLOBAL ? BQ_GLOBAL : BQ_LOCAL));
  const float *k = q + D, *v = q + 2 * D;
  for (int q0 = 0; q0 < L; q0 += bq) {
    const int q1 = std::min(L, q0 + bq), nq = q1 - q0;
    const int k0 = local ? std::max(0, q0 - a.half) : 0;
    const int k1 = local ? std::min(L, q1 + a.half) : L, span = k1 - k0;
    cblas_sgemm(kRowMajor, kNoTrans, kTrans, nq, span, hd, 1.0f, q + int64_t(q0) * D3, D3,
                k + int64_t(k0) * D3, D3, 0.0f, sc, span);
    for (int i = 0; i < nq; ++i) {
      float* s = sc + int64_t(i) * span;
      const int lo = local ? std::max(0, q0 + i - a.half) - k0 : 0;
      const int hi = local ? std::min(L, q0 + i + a.half + 1) - k0 : span;
      inv[i] = 1.0f / softmax_row(s + lo, kb ? kb + k0 + lo : nullptr, hi - lo);
      if (lo > 0) std::memset(s, 0, size_t(lo) * sizeof(float));
      if (hi < span) std::memset(s + hi, 0, size_t(span - hi) * sizeof(float));
    }
    float* o = out + int64_t(q0) * D;
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, nq, hd, span, 1.0f, sc, span,
                v + int64_t(k0) * D3, D3, 0.0f, o, D);
    for (int i = 0; i < nq; ++i) {
      float* oi = o + int64_t(i) * D;
      const float t = inv[i];
#pragma omp simd
      for (int j = 0; j < hd; ++j) oi[j] *= t;
    }
  }
}

FL_INLINE float act_one(int act, float t) {
  if (act == 0) return gelu_erf(t);
  if (act == 1) return t > 0.0f ? t : 0.0f;
  return 0.5f * t * (1.0f + std::tanh(0.7978845608028654f * (t + 0.044715f * t * t * t)));
}

// rotary q and k of heads [h0, h1) of every sequence in a.qkv, then their attention into
// a.ctx (part p's scores: BQ_GLOBAL x lmax floats)
FL_INLINE void rope_attend(const MbArgs& a, int h0, int h1, int p) {
  const int D = a.d, D3 = 3 * D, hd = D / a.heads;
  float* sc = a.scores + int64_t(p) * BQ_GLOBAL * a.lmax;  // nq x span, both within
  std::vector<float> inv(BQ_GLOBAL);
  int r0 = 0;
  for (int s = 0; s < a.n_seqs; ++s) {
    const int L = a.lens[s];
    for (int i = 0; i < L; ++i) {
      float* row = a.qkv + int64_t(r0 + i) * D3;
      const float *c = a.cos + int64_t(i) * hd, *sn = a.sin + int64_t(i) * hd;
      for (int hh = h0; hh < h1; ++hh) {
        rope_row(row + hh * hd, c, sn, hd);
        rope_row(row + D + hh * hd, c, sn, hd);
      }
    }
    for (int hh = h0; hh < h1 && L > 0; ++hh)
      attend(a, a.qkv + int64_t(r0) * D3 + hh * hd, a.kb ? a.kb + r0 : nullptr,
             a.ctx + int64_t(r0) * D + hh * hd, L, sc, inv.data());
    r0 += L;
  }
}

}  // namespace

}  // namespace mlx::core
