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
// int32 sums are bit-identical to int8_gemm_u8s8's (both exact with VNNI or AMX; without VNNI
// both saturate alike, and int8_gemm_any splits the codes: see there).
//
// Blob: a 64-byte header (magic, N, K, the packed layout's fingerprint, the data's offset) and
// the packed weight. A blob whose header does not match (N, K), or whose layout is not the one
// the primitive for this M asks for, is refused (int8_gemm_prepacked returns false and writes
// nothing): the caller then runs int8_gemm_u8s8 on the plain weight.
//
// Usage (C++ of a fused layer): int8_gemm_any(m, n, k, a, lda, packed, w, ldw, c, ldc), the
// one entry that is exact on every ISA (int8_gemm_u8s8 and int8_gemm_prepacked alone are
// oneDNN's kernels as they are, saturating without VNNI: see int8_gemm_any).
// Python: qkernel.int8_prepack(wq int8 (N, K)) -> uint8 blob (or None where unavailable).
#pragma once

#include <cstdint>
#include <string>

namespace mlx::core {

// C (m, n; row stride ldc) = A B^T in int32 for uint8 A (m, k; lda) and int8 B (n, k; ldb):
// oneDNN's dnnl_gemm_u8s8s32 on one OpenMP thread (int8_linear.cpp; throws without oneDNN);
// saturating without VNNI: callers use int8_gemm_any
void int8_gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                    const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc);

// The same GEMM adding into C (beta = 1: C += A B^T, int32): int8_gemm_any's second half
void int8_gemm_u8s8_acc(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
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

// Above this many rows int8_gemm_any runs dnnl_gemm_u8s8s32 even with a blob, except on AMX
// (int8_prepack_max_rows): its per-call packing is then amortised and its kernel measured ~5%
// faster (M = 2048 rows, MiniLM's shapes, one thread, an AMD EPYC with AVX-512 VNNI; equal at
// 512, the prepacked primitive ~20% faster at 24). Where oneDNN runs AMX, the prepacked
// primitive (brg:avx512_core_amx_int8) is 4.4x dnnl_gemm_u8s8s32 at 2048 rows (1.9 against
// 8.3 ms at 2048 x 384 x 1152, an Intel Xeon; bench/int8_scheme.py), so there it has no cut.
constexpr int64_t kInt8PrepackMaxRows = 512;

// The row cut in force: kInt8PrepackMaxRows, or no cut where oneDNN's effective ISA is AMX.
int64_t int8_prepack_max_rows();

// The one integer GEMM entry of every W8A8 op: C (m, n; ldc) = A B^T, exact int32 sums on every
// x86 ISA. The prepacked GEMM when `packed` is not null, m <= int8_prepack_max_rows() and the blob
// fits, else int8_gemm_u8s8 on the plain weight b (n, k; ldb). Returns whether the prepacked
// path ran.
//
// Where oneDNN's u8 x s8 kernels are not exact (int8_scheme() == "u8s8-split7": CPUs without
// VNNI, i.e. AVX2 or AVX-512 without VNNI, or ONEDNN_MAX_CPU_ISA capping oneDNN there), those
// kernels sum two u8 x s8 products in a saturating 16-bit lane (vpmaddubsw; oneDNN developer
// guide, "Nuances of int8 computations"): 255 * 127 * 2 = 64770 > 32767. There A is split into
// two 7-bit halves, lo = min(a, 127) in [0, 127] and hi = a - lo in [0, 128], whose pair sums
// fit in 16 bits for every int8 b (|2 * 128 * -128| = 32768 = -INT16_MIN), and C = lo B^T +
// hi B^T (two GEMMs on the same weight or blob; the second adds into C with beta = 1 on the
// plain GEMM, or goes through a per-thread buffer added in int32 on the prepacked one): the
// same int32 sums as one exact GEMM, bit for bit, at about twice the GEMM time or more.
bool int8_gemm_any(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                   const uint8_t* packed, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc);

// One oneDNN GEMM, as int8_gemm_any without the split: exact only where int8_scheme() is
// "u8s8" (benchmarks and tests of the saturation; callers use int8_gemm_any).
bool int8_gemm_one(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                   const uint8_t* packed, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc);

// "u8s8" where one oneDNN u8 x s8 GEMM gives exact int32 sums (oneDNN's effective ISA has VNNI
// or AMX, and a saturating probe through both GEMM paths came back exact), else "u8s8-split7"
// (int8_gemm_any's split, probed the same way), else "none" (no exact scheme: the Python side
// then refuses the compiled int8 ops, variants/runtime/int8_linear.py); decided once per
// process. "" without oneDNN.
std::string int8_scheme();

// oneDNN's effective CPU ISA (dnnl_get_effective_cpu_isa, which honours ONEDNN_MAX_CPU_ISA),
// e.g. "avx2", "avx512_core", "avx512_core_vnni", "avx512_core_amx"; "" without oneDNN.
std::string int8_cpu_isa();

// oneDNN's implementation name for the primitive of (m, n, k) (e.g. "brg:avx512_core_vnni"),
// "" when unavailable.
std::string int8_prepack_impl(int64_t m, int64_t n, int64_t k);

// How many int8_gemm_prepacked calls refused their blob since the process started (a layout
// mismatch or a foreign blob; their callers ran the plain GEMM).
int64_t int8_prepack_refusals();

}  // namespace mlx::core
