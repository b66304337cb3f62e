// A whole ModernBERT pre-norm encoder layer as ONE MLX CPU primitive (mlx-variants;
// variants/modernbert_fused.py is the Python side, variants/modernbert_fast.py the MLX path it
// replaces, same algebra):
//
//   x1 = x + Attn(LN1(x)) Wo + bo,   y = x1 + (act(h Win + bin) * (h Wgate + bgate)) Wout + bout,
//   h = LN2(x1)
//
// on modernbert_fast.layer_weights (transposed (K, N) weights, 1/sqrt(head_dim) folded into the
// query columns and bias, GeGLU's Wi cut into its input and gate halves). LN1 may be the
// identity (layer 0), the layer norms' and the Linears' biases may be absent (ModernBERT has
// none: norm_bias, attention_bias, mlp_bias false). Rows are sequences laid end to end (`lens`,
// as fused_layer.cpp); q and k are rotated (rotary, x cos + rotate_half(x) sin) by the tables
// passed in (row t of `cos` / `sin` (>= max(lens), head_dim): position t of a sequence, the
// layer's global or local θ). Attention per (sequence, head) with the additive key bias
// (padding) by blocks of queries: a global layer (or a local one whose window holds every key,
// L - 1 <= half) visits every key; a local layer's block of queries [q0, q1) multiplies only
// the keys [q0 - half, q1 - 1 + half] and each query's softmax runs over its own keys
// |q - k| <= half alone (the block's other keys, at most q1 - q0 - 1 per row, get an exact 0
// weight, not a -1e9 bias): the local layers' cost grows linearly with L. Blocks of BQ_LOCAL
// queries, or BQ_GLOBAL where those reach every key anyway (L <= 2 half + BQ_GLOBAL). Activation: 0 erf GELU, 1 ReLU,
// 2 tanh GELU (MLX's gelu_approx). Row loops, GEMMs (panel kernel at <= 32 rows when panels are
// given, OpenBLAS else) and the two-part helper thread: fused_common.h.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "fused_common.h"
#include "fused_mbert.h"
#include "fused_mbert_ops.h"  // norms, rotary, the windowed attention

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

namespace {

constexpr int kSlots = kMbSlots;  // the weights' slots, see fused_mbert_layer_cpu
constexpr int kPhases = 4;

// C (rows, c1 - c0) += A (rows, K) times columns [c0, c1) of matrix m (0 w_qkv, 1 w_o, 2 w_in,
// 3 w_gate, 4 w_out): the fp32 (K, N) weight (or its panels), or, quantized, those rows of
// the projection (Wi's gate half: rows F + c) dequantized first into wbuf by part p
FL_INLINE void proj_gemm(const MbArgs& a, int m, int c0, int c1, int K, const float* A, float* C,
                         int ldc, int p) {
  static constexpr int slot[5] = {WQKV, WO, WIN, WG, WOUT}, proj[5] = {0, 1, 2, 2, 3};
  if (!a.qw) {
    const int ldb = m == 0 ? 3 * a.d : (m == 2 || m == 3 ? a.f : a.d);
    return gemm_acc(a.rows, c1 - c0, K, A, K, a.w[slot[m]], ldb, c0, a.w[P0 + m], C, ldc,
                    a.avx2);
  }
  if (c1 <= c0) return;
  const QProj& q = a.qw[proj[m]];
  const int r0 = c0 + (m == 3 ? a.f : 0), r1 = r0 + (c1 - c0);
  float* dst = a.wbuf + int64_t(r0) * q.in;
  if (a.qpanels)
    qk_dequant_panels(q, dst, r0, r1, a.qtmp + int64_t(p) * 16 * std::max(a.d, a.f));
  else
    qk_dequant(q, dst, r0, r1);
  gemm_acc(a.rows, c1 - c0, K, A, K, a.wbuf, K, r0, a.qpanels ? a.wbuf : nullptr, C, ldc,
           a.avx2, !a.qpanels);
}

FL_INLINE void phase(const MbArgs& a, int k, int p, int n) {
  const int N = a.rows, D = a.d, F = a.f, hd = D / a.heads, D3 = 3 * D;
  const float* const* w = a.w;
  int lo, hi;
  if (k == 0) {  // h = LN1(x); q|k|v of this part's heads, rotary q, k; their attention
    int h0, h1;
    cut(a.heads, 1, p, n, h0, h1);
    lo = h0 * hd, hi = h1 * hd;
    const float* h = normed(a, a.x, w[G1], w[BE1], a.eps1, p);
    for (int j = 0; j < 3; ++j) {
      float* c = a.qkv + j * D;
      fill_cols(c, w[BQKV] ? w[BQKV] + j * D : nullptr, N, lo, hi, D3);
      proj_gemm(a, 0, j * D + lo, j * D + hi, D, h, c + lo, D3, p);
      if (a.qw && j == 0)  // quantized: q = (h Wq^T + b_q) * scale (fp32: folded in w_qkv)
        for (int i = 0; i < N; ++i)
          for (int t = lo; t < hi; ++t) c[int64_t(i) * D3 + t] *= a.q_scale;
    }
    rope_attend(a, h0, h1, p);
  } else if (k == 1 || k == 3) {  // y = x (k 1) + ctx Wo + bo, or y += inter Wout + bout
    cut(D, 16, p, n, lo, hi);
    const bool o = k == 1;
    const float* bias = w[o ? BO : BOUT];
    for (int i = 0; i < N; ++i) {
      float* yi = a.y + int64_t(i) * D;
      if (o) std::memcpy(yi + lo, a.x + int64_t(i) * D + lo, size_t(hi - lo) * sizeof(float));
      if (bias)
#pragma omp simd
        for (int j = lo; j < hi; ++j) yi[j] += bias[j];
    }
    proj_gemm(a, o ? 1 : 4, lo, hi, o ? D : F, o ? a.ctx : a.inter, a.y + lo, D, p);
  } else {  // h = LN2(x1); inter = act(h Win + bin) * (h Wgate + bgate), this part's columns
    cut(F, 16, p, n, lo, hi);
    const float* h = normed(a, a.y, w[G2], w[BE2], a.eps2, p);
    fill_cols(a.inter, w[BIN], N, lo, hi, F);
    proj_gemm(a, 2, lo, hi, D, h, a.inter + lo, F, p);
    fill_cols(a.gate, w[BG], N, lo, hi, F);
    proj_gemm(a, 3, lo, hi, D, h, a.gate + lo, F, p);
    for (int i = 0; i < N; ++i) {
      float* t = a.inter + int64_t(i) * F;
      const float* g = a.gate + int64_t(i) * F;
      if (a.act == 0) {
#pragma omp simd
        for (int j = lo; j < hi; ++j) t[j] = gelu_erf(t[j]) * g[j];
      } else {
        for (int j = lo; j < hi; ++j) t[j] = act_one(a.act, t[j]) * g[j];
      }
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MB_HAVE_AVX2 1
__attribute__((target("avx2,fma"))) void phase_avx2(const MbArgs& a, int k, int p, int n) {
  phase(a, k, p, n);
}
#endif

void phase_portable(const MbArgs& a, int k, int p, int n) { phase(a, k, p, n); }

void run_phase(const void* v, int k, int p, int n) {
  const MbArgs& a = *static_cast<const MbArgs*>(v);
#ifdef MB_HAVE_AVX2
  if (a.avx2) return phase_avx2(a, k, p, n);
#endif
  phase_portable(a, k, p, n);
}

}  // namespace

void fused_mbert_run(MbArgs& a, int parts) {
  const int* e = a.lens + a.n_seqs;
  const int Lmax = a.n_seqs == 0 ? 1 : std::max(1, *std::max_element(a.lens, e));
  const size_t n = size_t(a.rows), D = size_t(a.d), F = size_t(a.f);
  const size_t floats = n * (5 * D + 2 * F) + size_t(parts) * (n * D + size_t(BQ_GLOBAL) * Lmax);
  auto buf = allocator::allocator().malloc(floats * sizeof(float));
  float* b = static_cast<float*>(buf.raw_ptr());
  a.qkv = b;
  a.ctx = b + n * 3 * D;
  a.inter = b + n * 4 * D;
  a.gate = a.inter + n * F;
  a.h = a.gate + n * F;
  a.scores = a.h + size_t(parts) * n * D;
  a.lmax = Lmax;
  run_parts(run_phase, &a, kPhases, parts);
  allocator::allocator().free(buf);
}

class FusedMbertLayerCpu : public UnaryPrimitive {
 public:
  FusedMbertLayerCpu(Stream s, std::vector<int> lens, bool has_kb, uint32_t present, int heads,
                     float eps1, float eps2, int act, int half, int lblock, int threads)
      : UnaryPrimitive(s), lens_(std::move(lens)), has_kb_(has_kb), present_(present),
        heads_(heads), eps1_(eps1), eps2_(eps2), act_(act), half_(half), lblock_(lblock),
        threads_(threads) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::vector<array> ins;
    for (auto& a : inputs) ins.push_back(array::unsafe_weak_copy(a));
    enc.dispatch([ins = std::move(ins), o = array::unsafe_weak_copy(out), lens = lens_,
                  has_kb = has_kb_, present = present_, heads = heads_, eps1 = eps1_,
                  eps2 = eps2_, act = act_, half = half_, lblock = lblock_,
                  threads = threads_]() mutable {
      MbArgs a{};
      const int N = ins[0].shape(0), D = ins[0].shape(1);
      int i = 0;
      a.x = ins[i++].data<float>();
      a.kb = has_kb ? ins[i++].data<float>() : nullptr;
      a.cos = ins[i++].data<float>();
      a.sin = ins[i++].data<float>();
      int F = 0;
      for (int j = 0; j < kSlots; ++j) {
        if (!((present >> j) & 1u)) continue;
        if (j == WIN) F = ins[i].shape(1);  // w_in_t (D, F)
        a.w[j] = ins[i++].data<float>();
      }
      a.y = o.data<float>();
      a.lens = lens.data();
      a.n_seqs = int(lens.size());
      a.rows = N, a.d = D, a.f = F, a.heads = heads, a.act = act, a.half = half;
      a.lblock = lblock;
      a.avx2 = fused_use_avx2();
      a.eps1 = eps1, a.eps2 = eps2;
      fused_mbert_run(a, threads >= 2 ? 2 : 1);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("FusedMbertLayerCpu has no GPU implementation");
  }
  DEFINE_NAME(FusedMbertLayerCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FusedMbertLayerCpu&>(other);
    return lens_ == o.lens_ && has_kb_ == o.has_kb_ && present_ == o.present_ &&
           heads_ == o.heads_ && eps1_ == o.eps1_ && eps2_ == o.eps2_ && act_ == o.act_ &&
           half_ == o.half_ && lblock_ == o.lblock_ && threads_ == o.threads_;
  }

 private:
  std::vector<int> lens_;
  bool has_kb_;
  uint32_t present_;
  int heads_;
  float eps1_, eps2_;
  int act_, half_, lblock_, threads_;
};

namespace {

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("fused_mbert_layer: ") + what);
}

bool shaped(const std::optional<array>& a, std::initializer_list<int> shape) {
  return a && a->shape() == Shape(shape);
}

}  // namespace

array fused_mbert_layer_cpu(const array& x, const std::vector<int>& lens,
                            const std::optional<array>& key_bias, const array& cos,
                            const array& sin, const std::vector<std::optional<array>>& w,
                            int heads, float eps1, float eps2, int act, int half, int local_block,
                            int threads) {
  auto s = to_stream({});
  need(s.device == Device::cpu, "CPU stream only");
  need(w.size() == 14 || w.size() == kSlots,
       "weights: w_qkv_t, b_qkv, w_o_t, b_o, w_in_t, b_in, w_gate_t, b_gate, w_out_t, b_out, g1, "
       "b1, g2, b2 (biases, g1, b1, b2 may be None) [, the five weights as 16-column panels]");
  fused_mbert_check("fused_mbert_layer", x, lens, cos, sin, heads, act);
  const int N = x.shape(0), D = x.shape(1);
  const int F = w[4] && w[4]->ndim() == 2 ? w[4]->shape(1) : -1;
  need(F > 0, "w_in_t (D, F)");
  need(shaped(w[0], {D, 3 * D}) && shaped(w[2], {D, D}) && shaped(w[4], {D, F}) &&
           shaped(w[6], {D, F}) && shaped(w[8], {F, D}) && shaped(w[12], {D}),
       "w_qkv_t (D, 3D), w_o_t (D, D), w_in_t, w_gate_t (D, F), w_out_t (F, D), g2 (D,)");
  const int vec[14] = {0, 3 * D, 0, D, 0, F, 0, F, 0, D, D, D, D, D};  // (n,) slots
  for (int j : {1, 3, 5, 7, 9, 10, 11, 13})
    need(!w[j] || shaped(w[j], {vec[j]}), "b_qkv (3D,), b_o, b_out, g1, b1, b2 (D,), b_in, "
                                          "b_gate (F,)");
  need(w[10] || !w[11], "b1 without g1");
  if (w.size() == kSlots) {
    const int kn[5][2] = {{D, 3 * D}, {D, D}, {D, F}, {D, F}, {F, D}};
    for (int j = 0; j < 5; ++j)
      need(kn[j][1] % 16 == 0 && shaped(w[14 + j], {kn[j][1] / 16, kn[j][0], 16}),
           "panels (N/16, K, 16) of w_qkv_t, w_o_t, w_in_t, w_gate_t, w_out_t");
  }
  std::vector<array> in = {contiguous(x, false, s)};
  if (key_bias) {
    need(key_bias->dtype() == float32 && key_bias->size() == size_t(N), "key_bias (rows,)");
    in.push_back(contiguous(reshape(*key_bias, {N}, s), false, s));
  }
  in.push_back(contiguous(cos, false, s));
  in.push_back(contiguous(sin, false, s));
  uint32_t present = 0;
  for (size_t j = 0; j < w.size(); ++j) {
    if (!w[j]) continue;
    need(w[j]->dtype() == float32, "weights must be float32");
    present |= 1u << j;
    in.push_back(contiguous(*w[j], false, s));
  }
  return array({N, D}, float32,
               std::make_shared<FusedMbertLayerCpu>(s, lens, bool(key_bias), present, heads, eps1,
                                                    eps2, act, half, local_block, threads),
               in);
}

void register_fused_mbert_layer(nb::module_& m) {
  m.def("fused_mbert_layer", &fused_mbert_layer_cpu, "x"_a, "lens"_a, "key_bias"_a = nb::none(),
        "cos"_a, "sin"_a, "weights"_a, "heads"_a, "eps1"_a, "eps2"_a, "act"_a = 0, "half"_a = -1,
        "local_block"_a = 0, "threads"_a = 0,
        "One ModernBERT pre-norm layer on rows x (N, D) float32 (sequences of `lens` rows end "
        "to end), modernbert_fast.layer_weights + norms (see fused_mbert_layer.cpp); half: the "
        "local window's half width, -1 global; local_block: a local layer's query block "
        "(<= 64; 0: auto); CPU stream. -> (N, D).");
}

}  // namespace mlx::core
