// What the compiled layer ops share (mlx-variants, variants/qkernel): fused_layer.cpp (the
// post-norm BERT layer), fused_qlayer.cpp (the same on quantized weights, through
// fused_run_layer), fused_int8_layer.cpp (the same on int8 GEMMs) and fused_mbert_layer.cpp
// (ModernBERT's pre-norm layer). The row loops are
// inlined into each op's AVX2 clone and portable entry (FL_INLINE); the includer compiles with
// -fopenmp-simd (the `#pragma omp simd` reductions) and includes <immintrin.h> on x86-64.
// Numerics: see fused_layer.cpp's header comment.
#pragma once

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "fused_layer.h"

namespace mlx::core {

// A layer split in parts: part p (of n) of phase k touches only its own heads, columns or rows,
// so the parts of a phase can run at once; the phases follow each other.
using PhaseFn = void (*)(const void* args, int k, int p, int n);

// One helper thread for a layer split in two parts (B = 1: the other stream is idle): the
// calling thread runs part 0 of each phase, the helper part 1, and each waits for the other
// (blocking waits, no spinning: on a shared machine a spinning thread keeps a core from the
// other). Created on first use and never joined (a detached thread parked on its condition
// variable), one for all the ops (an inline function's static: one per program); one layer at
// a time uses it (`busy`), a second one meanwhile runs its parts in turn (run_parts).
class PartsHelper {
 public:
  static PartsHelper& get() {
    static PartsHelper* h = new PartsHelper();  // leaked on purpose: no join at exit
    return *h;
  }
  std::mutex busy;
  void run(PhaseFn fn, const void* a, int phases) {
    for (int k = 0; k < phases; ++k) {
      {
        std::lock_guard<std::mutex> lk(m_);
        fn_ = fn;
        args_ = a;
        phase_ = k;
        ticket_++;
      }
      cv_.notify_one();
      fn(a, k, 0, 2);
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return done_ == ticket_; });
    }
  }

 private:
  PartsHelper() { std::thread([this] { loop(); }).detach(); }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return ticket_ != seen; });
      seen = ticket_;
      const PhaseFn fn = fn_;
      const void* a = args_;
      const int k = phase_;
      lk.unlock();
      fn(a, k, 1, 2);
      lk.lock();
      done_ = seen;
      lk.unlock();
      done_cv_.notify_one();
    }
  }
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  PhaseFn fn_ = nullptr;
  const void* args_ = nullptr;
  int phase_ = 0;
  uint64_t ticket_ = 0, done_ = 0;
};

// the phases of a layer: split in two parts over the helper when parts >= 2 and it is free,
// else in turn on the calling thread
inline void run_parts(PhaseFn fn, const void* a, int phases, int parts) {
  if (parts >= 2) {
    PartsHelper& h = PartsHelper::get();
    std::unique_lock<std::mutex> lk(h.busy, std::try_to_lock);
    if (lk.owns_lock()) return h.run(fn, a, phases);
  }
  for (int k = 0; k < phases; ++k) fn(a, k, 0, 1);
}

namespace {

#define FL_INLINE inline __attribute__((always_inline))

// ---- row loops (always inlined into the AVX2 clone and into the portable entry) ----------

FL_INLINE float exp_nonpos(float x) {
  // exp(x) for x <= 0 (Cody & Waite 1980 reduction, Cephes expf polynomial)
  x = x < -87.3f ? -87.3f : x;
  const float n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return (p * r2 + r + 1.0f) * scale;
}

FL_INLINE float gelu_erf(float x) {
  // 0.5 x (1 + erf(x / sqrt 2)), erf(u) ~ u P(u^2) / Q(u^2) on |u| <= 4 (Eigen / XLA float32)
  float u = x * 0.70710678118654752f;
  u = u < -4.0f ? -4.0f : (u > 4.0f ? 4.0f : u);
  const float z = u * u;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f;
  p = p * z + -2.10102402082508e-06f;
  p = p * z + -5.69250639462346e-05f;
  p = p * z + -7.34990630326855e-04f;
  p = p * z + -2.95459980854025e-03f;
  p = p * z + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z + -2.13374055278905e-04f;
  q = q * z + -1.68282697438203e-03f;
  q = q * z + -7.37332916720468e-03f;
  q = q * z + -1.42647390514189e-02f;
  const float half = 0.5f * x;
  return half + (half * u) * p / q;
}

// e = exp(s + kb - max(s + kb)) in place over one row of n scores; returns sum(e)
FL_INLINE float softmax_row(float* s, const float* kb, int n) {
  float m = -INFINITY;
  if (kb) {
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n; ++j) {
      s[j] += kb[j];
      m = std::max(m, s[j]);
    }
  } else {
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n; ++j) m = std::max(m, s[j]);
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    s[j] = exp_nonpos(s[j] - m);
    sum += s[j];
  }
  return sum;
}

// out = LN(a + b) * g + beta over one row of d (out may alias a or b)
FL_INLINE void add_layer_norm_row(const float* a, const float* b, const float* g,
                                  const float* beta, float eps, float* out, int d) {
  float mean = 0.0f;
#pragma omp simd reduction(+ : mean)
  for (int j = 0; j < d; ++j) {
    out[j] = a[j] + b[j];
    mean += out[j];
  }
  mean /= float(d);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int j = 0; j < d; ++j) {
    const float c = out[j] - mean;
    var += c * c;
  }
  const float inv = 1.0f / std::sqrt(var / float(d) + eps);
#pragma omp simd
  for (int j = 0; j < d; ++j) out[j] = (out[j] - mean) * inv * g[j] + beta[j];
}

// the attention of heads [h0, h1) over every sequence: qkv (rows, 3D) holds q (already scaled),
// k, v side by side; ctx (rows, D) gets softmax(q k^T + kb) v for those heads' columns;
// scores: lmax^2 floats of the caller's own
FL_INLINE void attend_heads(const float* qkv, float* ctx, float* scores, const int* lens,
                            int n_seqs, const float* kb_all, int D, int hd, int h0, int h1,
                            int lmax) {
  const int D3 = 3 * D;
  std::vector<float> inv(static_cast<size_t>(lmax));
  int r0 = 0;
  for (int s = 0; s < n_seqs; ++s) {
    const int L = lens[s];
    if (L == 0) continue;
    const float* kb = kb_all ? kb_all + r0 : nullptr;
    for (int h = h0; h < h1; ++h) {
      // S = Q K^T, e = exp(S + kb - rowmax), ctx = (e V) / rowsum(e)
      const float* q = qkv + int64_t(r0) * D3 + h * hd;
      const float* kk = q + D;
      const float* v = q + 2 * D;
      float* c = ctx + int64_t(r0) * D + h * hd;
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, L, L, hd, 1.0f, q, D3, kk, D3, 0.0f, scores, L);
      for (int i = 0; i < L; ++i) inv[i] = 1.0f / softmax_row(scores + int64_t(i) * L, kb, L);
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, L, hd, L, 1.0f, scores, L, v, D3, 0.0f, c, D);
      for (int i = 0; i < L; ++i) {
        float* ci = c + int64_t(i) * D;
        const float t = inv[i];
#pragma omp simd
        for (int j = 0; j < hd; ++j) ci[j] *= t;
      }
    }
    r0 += L;
  }
}

FL_INLINE void fill_rows(float* c, const float* bias, int64_t rows, int64_t n, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i) std::memcpy(c + i * ldc, bias, size_t(n) * sizeof(float));
}

#include "panel_gemm.h"  // panel_gemm_avx2: the GEMM for <= 32 rows

// C (M, N) += A B, B the columns [c0, c0 + N) of a (K, ldb) weight: by the panel kernel when
// its panels P are given, the block starts and ends on a panel edge and the CPU has AVX2+FMA,
// else OpenBLAS. trans: B^T, B the rows [c0, c0 + N) of an (N_all, K) weight (OpenBLAS).
void gemm_acc(int M, int N, int K, const float* A, int lda, const float* B, int ldb, int c0,
              const float* P, float* C, int ldc, bool avx2, bool trans = false) {
  if (N <= 0 || M <= 0) return;
  if (trans)
    return cblas_sgemm(kRowMajor, kNoTrans, kTrans, M, N, K, 1.0f, A, lda, B + int64_t(c0) * K,
                       K, 1.0f, C, ldc);
#ifdef FL_HAVE_PANELS
  if (avx2 && P && c0 % 16 == 0 && N % 16 == 0)
    return panel_gemm_avx2(M, N, K, A, lda, P + int64_t(c0) * K, C, ldc);
#endif
  cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, M, N, K, 1.0f, A, lda, B + c0, ldb, 1.0f, C, ldc);
}

// part p of n of [0, len), cut at multiples of `unit` when len is one
FL_INLINE void cut(int len, int unit, int p, int n, int& lo, int& hi) {
  const int u = len % unit == 0 ? unit : 1, units = len / u;
  lo = int(int64_t(units) * p / n) * u;
  hi = int(int64_t(units) * (p + 1) / n) * u;
}

// columns [c0, c1) of every row of c: the bias's entries, or zeros
FL_INLINE void fill_cols(float* c, const float* bias, int rows, int c0, int c1, int ldc) {
  for (int i = 0; i < rows; ++i) {
    float* ci = c + int64_t(i) * ldc;
    if (bias)
      std::memcpy(ci + c0, bias + c0, size_t(c1 - c0) * sizeof(float));
    else
      std::memset(ci + c0, 0, size_t(c1 - c0) * sizeof(float));
  }
}

}  // namespace

}  // namespace mlx::core
