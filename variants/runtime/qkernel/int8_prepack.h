// Prepacked int8 weights for oneDNN's matmul primitive (mlx-variants, variants/runtime/qkernel;
// int8_prepack.cpp implements it). The shared integer GEMM of the W8A8 ops: int8_linear.cpp and
// fused_int8_layer.cpp call it; any other fused int8 layer can (the same entry as
// int8_gemm_u8s8, plus a packed blob).
//
// dnnl_gemm_u8s8s32 re-packs its int8 operand on every call (at a few rows, ~20% of the GEMM).
// Here the weight is reordered ONCE into the layout oneDNN's u8 x s8 -> s32 matmul primitive
// prefers (on AVX-512 VNNI `brg:avx512_core_vnni`; the layout does not depend on the row count
// M), kept as a uint8 blob the caller owns (an MLX array made once per weight set and passed
// as an op argument), and each call runs a matmul primitive made for its (M, N, K, lda, ldc)
// (cached here: primitives hold no weight data) with a scratchpad per calling thread. The
// int32 sums are exact (integer arithmetic): bit-identical to int8_gemm_u8s8's.
//
// Blob: a 64-byte header (magic, N, K, the packed layout's fingerprint, the data's offset) and
// the packed weight. A blob whose header does not match (N, K), or whose layout is not the one
// the primitive for this M asks for, is refused (int8_gemm_prepacked returns false and writes
// nothing): the caller then runs int8_gemm_u8s8 on the plain weight.
//
// Usage (C++ of a fused layer):
//   if (!(packed && int8_gemm_prepacked(m, n, k, a, lda, packed, c, ldc)))
//     int8_gemm_u8s8(m, n, k, a, lda, w, ldw, c, ldc);     // or int8_gemm_any(...), same thing
// Python: qkernel.int8_prepack(wq int8 (N, K)) -> uint8 blob (or None where unavailable).
#pragma once

#include <cstdint>
#include <string>

namespace mlx::core {

// C (m, n; row stride ldc) = A B^T in int32 for uint8 A (m, k; lda) and int8 B (n, k; ldb):
// oneDNN's dnnl_gemm_u8s8s32 on one OpenMP thread (int8_linear.cpp; throws without oneDNN)
void int8_gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                    const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc);

// Bytes of the blob of an int8 weight (n, k), or 0 when no u8 x s8 matmul primitive exists
// for it (built without oneDNN, or oneDNN refuses the shape).
int64_t int8_prepack_bytes(int64_t n, int64_t k);

// Packs w (n rows, k columns, row stride ldw; w @ x.T's weight) into dst
// (int8_prepack_bytes(n, k) bytes). false (dst unspecified) when unavailable.
bool int8_prepack(const int8_t* w, int64_t n, int64_t k, int64_t ldw, uint8_t* dst);

// C (m, n; ldc) = A (m, k; lda) B^T with B from its blob, on the calling thread. false (C not
// written) when the blob does not fit (see above); m == 0 writes nothing and returns true.
// Safe from several threads at once, on the same blob or not.
bool int8_gemm_prepacked(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                         const uint8_t* packed, int32_t* c, int64_t ldc);

// Above this many rows int8_gemm_any runs dnnl_gemm_u8s8s32 even with a blob: its per-call
// packing is then amortised and its kernel measured ~5% faster (M = 2048 rows, MiniLM's
// shapes, one thread; equal at 512, the prepacked primitive ~20% faster at 24).
constexpr int64_t kInt8PrepackMaxRows = 512;

// The prepacked GEMM when `packed` is not null, m <= kInt8PrepackMaxRows and the blob fits,
// else int8_gemm_u8s8 on the plain weight b (n, k; ldb). Returns whether the prepacked path ran.
inline bool int8_gemm_any(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                          const uint8_t* packed, const int8_t* b, int64_t ldb, int32_t* c,
                          int64_t ldc) {
  if (packed && m <= kInt8PrepackMaxRows &&
      int8_gemm_prepacked(m, n, k, a, lda, packed, c, ldc))
    return true;
  int8_gemm_u8s8(m, n, k, a, lda, b, ldb, c, ldc);
  return false;
}

// oneDNN's implementation name for the primitive of (m, n, k) (e.g. "brg:avx512_core_vnni"),
// "" when unavailable.
std::string int8_prepack_impl(int64_t m, int64_t n, int64_t k);

// How many int8_gemm_prepacked calls refused their blob since the process started (a layout
// mismatch or a foreign blob; their callers ran the plain GEMM).
int64_t int8_prepack_refusals();

}  // namespace mlx::core
