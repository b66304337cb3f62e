// Half-precision scales and biases widened to float32 (mlx-variants, variants/qkernel):
// qkernel.cpp's dequantizer widens a block of rows' scales with these before its float32 loops.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mlx::core {

// IEEE binary16 -> float32, branch-free: exponent and mantissa moved to float32's places, then
// scaled by 2^112 (the exponent biases' difference): exact for normal and subnormal halves;
// inf / NaN get the top exponent
inline float f16_to_f32(uint16_t h) {
  uint32_t m = (uint32_t(h) & 0x7fffu) << 13, u;
  float f;
  std::memcpy(&f, &m, 4);
  f *= 0x1p112f;
  std::memcpy(&u, &f, 4);
  u |= ((h & 0x7c00u) == 0x7c00u) ? 0x7f800000u : 0u;
  u |= (uint32_t(h) & 0x8000u) << 16;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16 -> float32: the top half of the float32's bits
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void widen_portable(const uint16_t* src, float* dst, int64_t n, bool bf16) {
  if (bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// 8 at a time: F16C's vcvtph2ps (exact) or a zero-extend and shift by 16
__attribute__((target("avx2,f16c"))) inline void widen_avx2(const uint16_t* src, float* dst,
                                                             int64_t n, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 f = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                          : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(dst + i, f);
  }
  widen_portable(src + i, dst + i, n - i, bf16);
}
#endif

}  // namespace mlx::core
