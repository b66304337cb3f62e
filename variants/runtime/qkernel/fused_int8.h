// What the compiled W8A8 layer ops share (mlx-variants, variants/qkernel): fused_int8_layer.cpp
// (the post-norm BERT layer) and fused_mbert_int8layer.cpp (ModernBERT's pre-norm layer). Each
// projection is int8_linear.cpp's arithmetic: its input rows (times SmoothQuant's 1/s per input
// channel when given) quantized per row to uint8 (scale = (hi - lo) / 255 over [min(x, 0),
// max(x, 0)], zero point round(-lo / scale), codes clamp(round(x / scale) + zp, 0, 255), round
// half to even), multiplied by the int8 weight rows through int8_gemm_rows (the one integer
// GEMM entry of every op: int8_prepack.h's prepacked matmul when the projection has a blob,
// else dnnl_gemm_u8s8s32), then the fp32 epilogue
//   y_ij = (scale_i * w_scale_j) * (C_ij - zp_i * colsum_j) + bias_j
// (compiled without FMA contraction: the same float32 values as int8_linear for the same codes).
// Include after fused_common.h (FL_INLINE); the includer compiles with -fopenmp-simd,
// -fno-trapping-math (the clamps vectorize) and -fno-strict-aliasing (epilogues read int32
// products from the float32 buffer they write).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "int8_prepack.h"  // the integer GEMM entries (plain and prepacked)

namespace mlx::core {

bool int8_has_dnnl();  // int8_linear.cpp

namespace {

// an int32 product written over its float32 result (the epilogue converts it in place; a
// may_alias type would not vectorize)
typedef int32_t i32a;

// one W8A8 projection: wq (n, k) row-major int8, w_scale, colsum = sum_k wq (n,), bias (n,);
// packed: int8_prepack's blob of the whole wq (n rows) or null
struct I8Proj {
  const int8_t* w;
  const float *ws, *bias;
  const int32_t* colsum;
  const uint8_t* packed = nullptr;
  int n = 0;
};

// round(t) for |t| <= 255 as (t + 1.5 * 2^23) - 1.5 * 2^23: round half to even, as
// std::nearbyint in the default mode, and vectorizable
FL_INLINE float round_small(float t) { return (t + 12582912.0f) - 12582912.0f; }

// (min(x, 0), max(x, 0)) over k values, by 8-lane vectors: GCC 12 leaves the `omp simd` min /
// max reduction scalar (vminss / vmaxss: ~9% of a ModernBERT int8 layer at 128 rows); min and
// max are exact, so the lanes' order changes nothing (the same floats as int8_linear's loop)
typedef float f8v __attribute__((vector_size(32)));

FL_INLINE void min_max0(const float* x, int k, float& lo, float& hi) {
  f8v lo8 = {}, hi8 = {};
  int j = 0;
  for (; j + 8 <= k; j += 8) {
    f8v v;
    std::memcpy(&v, x + j, sizeof(v));
    lo8 = v < lo8 ? v : lo8;
    hi8 = v > hi8 ? v : hi8;
  }
  lo = 0.0f, hi = 0.0f;
  for (int t = 0; t < 8; ++t) {
    lo = lo8[t] < lo ? lo8[t] : lo;
    hi = hi8[t] > hi ? hi8[t] : hi;
  }
  for (; j < k; ++j) {
    lo = x[j] < lo ? x[j] : lo;
    hi = x[j] > hi ? x[j] : hi;
  }
}

// int8_linear.cpp's quantize_row: the same operations in the same order; sm: 1/s or null, tmp:
// k floats (GCC 12 vectorizes the code loop without `omp simd`, not with it)
FL_INLINE void quantize_row8(const float* x, const float* sm, int k, float* tmp,
                             uint8_t* __restrict q, float& scale, int32_t& zp) {
  const float* src = x;
  if (sm) {
    for (int j = 0; j < k; ++j) tmp[j] = x[j] * sm[j];
    src = tmp;
  }
  float lo, hi;
  min_max0(src, k, lo, hi);
  float s = (hi - lo) / 255.0f;
  if (!(s > 0.0f)) s = 1.0f;
  float z = round_small(-lo / s);
  z = std::min(255.0f, std::max(0.0f, z));
  for (int j = 0; j < k; ++j) {
    float v = round_small(src[j] / s) + z;
    v = std::min(255.0f, std::max(0.0f, v));
    q[j] = uint8_t(int32_t(v));
  }
  scale = s;
  zp = int32_t(z);
}

// rows of x (stride ldx, k inputs) into codes (rows, k), scales rs and zero points zp
FL_INLINE void quantize_rows8(const float* x, int64_t ldx, int rows, int k, const float* sm,
                              float* tmp, uint8_t* codes, float* rs, int32_t* zp) {
  for (int i = 0; i < rows; ++i)
    quantize_row8(x + i * ldx, sm, k, tmp, codes + int64_t(i) * k, rs[i], zp[i]);
}

// the epilogue's value before the bias: (scale_i * w_scale_j) * (C_ij - zp_i * colsum_j)
FL_INLINE float int8_value(int32_t c, float si, int32_t zi, float wsj, int32_t csj) {
  return (si * wsj) * float(c - zi * csj);
}

// c (rows, n; stride ldc) as int32 = codes (rows, k) times the weight rows w (n, k)^T; packed:
// int8_prepack's blob of exactly these n rows of w (oneDNN's matmul primitive on it, up to
// int8_prepack_max_rows() rows), or null (dnnl_gemm_u8s8s32): the same int32 sums
FL_INLINE void int8_gemm_rows(int rows, int n, int k, const uint8_t* codes, const int8_t* w,
                              float* c, int64_t ldc, const uint8_t* packed = nullptr) {
  if (rows <= 0 || n <= 0) return;
  int8_gemm_any(rows, n, k, codes, k, packed, w, k, reinterpret_cast<i32a*>(c), ldc);
}

}  // namespace

}  // namespace mlx::core
