// What fused_mbert_layer.cpp (ModernBERT's pre-norm layer on fp32 weights) shares with
// fused_mbert_qlayer.cpp (the same layer on affine-quantized projections): the layer's
// arguments and its runner (mlx-variants, variants/qkernel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fused_layer.h"
#include "mlx/array.h"

namespace mlx::core {

constexpr int kMbSlots = 19;  // the weights' slots (enum below)

// w_qkv b_qkv w_o b_o w_in b_in w_g b_g w_out b_out g1 be1 g2 be2, then the panels of
// w_qkv w_o w_in w_g w_out (absent: null)
enum { WQKV, BQKV, WO, BO, WIN, BIN, WG, BG, WOUT, BOUT, G1, BE1, G2, BE2, P0 };

struct MbArgs {
  const float *x, *kb, *cos, *sin;
  const float* w[kMbSlots];  // fp32: the (K, N) weights; quantized: biases and norms only
  float *y, *qkv, *ctx, *h, *inter, *gate, *scores;  // h, scores: per part
  const int* lens;
  int n_seqs, rows, d, f, heads, act, half, lmax;  // half < 0: a global layer
  int lblock;  // a local layer's query block (0: auto)
  bool avx2;
  float eps1, eps2;
  // quantized (fused_mbert_qlayer.cpp): Wqkv (3D, D), Wo (D, D), Wi (2F, D), Wout (D, F) in
  // mx.quantize's packing; each phase part dequantizes the weight rows it multiplies into
  // wbuf at their own row offset ((N, K) rows, or 16-column panels when qpanels, staged
  // through qtmp: 16 * max(D, F) floats per part), q = (h Wq^T + b_q) * q_scale
  const QProj* qw = nullptr;
  float* wbuf = nullptr;
  float* qtmp = nullptr;
  float q_scale = 1.0f;
  bool qpanels = false;
};

// a's activation scratch from MLX's allocator (x, lens, rows, d, f set), the layer in one part
// or two (parts >= 2: over fused_common.h's helper thread), the scratch freed
void fused_mbert_run(MbArgs& a, int parts);

// Both ops' common argument checks: x (rows, D) float32, lens (>= 0) summing to rows, heads
// dividing D with an even head_dim, act 0..2, cos and sin float32 (>= max(lens), head_dim).
// Throws std::invalid_argument "<op>: ..." naming the argument; returns max(lens).
inline int fused_mbert_check(const char* op, const array& x, const std::vector<int>& lens,
                             const array& cos, const array& sin, int heads, int act) {
  auto check = [op](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string(op) + ": " + what);
  };
  check(x.dtype() == float32 && x.ndim() == 2, "x must be float32 (rows, D)");
  const int N = x.shape(0), D = x.shape(1);
  check(heads > 0 && D % heads == 0 && (D / heads) % 2 == 0, "heads must divide D, even head_dim");
  check(act >= 0 && act <= 2, "act must be 0 (erf GELU), 1 (ReLU) or 2 (tanh GELU)");
  int64_t total = 0;
  int Lmax = 0;
  for (int L : lens) {
    check(L >= 0, "lens must be >= 0");
    total += L;
    Lmax = std::max(Lmax, L);
  }
  check(total == N, "lens must sum to the rows of x");
  const int hd = D / heads;
  for (auto* t : {&cos, &sin})
    check(t->dtype() == float32 && t->ndim() == 2 && t->shape(0) >= Lmax && t->shape(1) == hd,
          "cos, sin (>= max(lens), head_dim) float32");
  return Lmax;
}

}  // namespace mlx::core
