// The small-M GEMM of fused_layer.cpp (mlx-variants, variants/qkernel), included by it inside
// its anonymous namespace (FL_INLINE comes from there).
// C (M, N) += A (M, K) B (K, N) for few rows M (<= 32: one short sequence). OpenBLAS packs
// the whole of B (a weight, K x N) on every call, which at M = 24 costs a good part of what the
// arithmetic does; here B comes pre-packed once per weight set as N/16 panels of K x 16
// (contiguous), and each 6-row tile of A runs over a panel with 6 x 16 accumulators in 12 AVX
// registers (measured alone, M = 24, MiniLM's four GEMMs: 0.85-1.2 ms against OpenBLAS's
// 1.08-1.34; at M >= 48 OpenBLAS is as fast or faster, so larger calls use it).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
template <int MR>
__attribute__((target("avx2,fma"))) FL_INLINE void tile_avx2(int K, const float* A, int lda,
                                                             const float* P, float* C,
                                                             int ldc) {
  __m256 c0[MR], c1[MR];
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm256_loadu_ps(C + int64_t(i) * ldc);
    c1[i] = _mm256_loadu_ps(C + int64_t(i) * ldc + 8);
  }
  for (int k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(P + 16 * k), b1 = _mm256_loadu_ps(P + 16 * k + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(A + int64_t(i) * lda + k);
      c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(C + int64_t(i) * ldc, c0[i]);
    _mm256_storeu_ps(C + int64_t(i) * ldc + 8, c1[i]);
  }
}

// P: N/16 panels, panel p = B[:, 16p:16p+16] as K x 16 row-major (N % 16 == 0)
__attribute__((target("avx2,fma"))) void panel_gemm_avx2(int M, int N, int K, const float* A,
                                                         int lda, const float* P, float* C,
                                                         int ldc) {
  for (int n0 = 0; n0 < N; n0 += 16) {
    const float* p = P + int64_t(n0) * K;
    int m0 = 0;
    for (; m0 + 6 <= M; m0 += 6)
      tile_avx2<6>(K, A + int64_t(m0) * lda, lda, p, C + int64_t(m0) * ldc + n0, ldc);
    const float* a = A + int64_t(m0) * lda;
    float* c = C + int64_t(m0) * ldc + n0;
    switch (M - m0) {
      case 5: tile_avx2<5>(K, a, lda, p, c, ldc); break;
      case 4: tile_avx2<4>(K, a, lda, p, c, ldc); break;
      case 3: tile_avx2<3>(K, a, lda, p, c, ldc); break;
      case 2: tile_avx2<2>(K, a, lda, p, c, ldc); break;
      case 1: tile_avx2<1>(K, a, lda, p, c, ldc); break;
      default: break;
    }
  }
}
#define FL_HAVE_PANELS 1
#endif
