// A whole post-norm BERT encoder layer as ONE MLX CPU primitive (mlx-variants,
// variants/fused_layer.py is the Python side).
//
//   y = LN2(h + GELU(h Wi + bi) Wu + bu),  h = LN1(x + Attn(x) Wo + bo)
//
// with the reference's folded weights (variants/fused.py): one (D, 3D) q|k|v weight with
// 1/sqrt(head_dim) folded into the query part and its bias, no key bias (softmax ignores it),
// the value bias folded into bo. Rows are sequences laid end to end: `lens` gives each
// sequence's row count (a padded (B, L) batch: B times L; a packed batch: the real tokens of each
// sequence). Each sequence's rows attend to its own rows only, with an optional additive key
// bias per row (the padding bias), so one primitive serves the padded and the packed layouts.
//
// Why: at B=1 L=24 a layer is ~30 MLX ops of ~16 us fixed cost each; here it is one op whose
// arithmetic is 5 cblas_sgemm calls (projections, OpenBLAS), 2 small sgemm per (sequence, head)
// for the attention, and fused row loops (softmax with exp(s - max), bias + GELU,
// residual + layer norm). `threads` >= 2: the layer's work is split in two parts (heads, output
// columns, rows), the second run by one helper thread of this library, for a caller that knows
// no other stream is busy (B = 1); OpenBLAS keeps its own thread setting (1 under the streams).
//
// Numerics (float32 throughout): softmax exp(s - rowmax) by the Cody-Waite reduction and the
// Cephes expf polynomial (max rel. error ~1.2e-7, as variants/fast_ops.exp_nonpositive),
// normalised after e @ V; GELU 0.5x(1 + erf(x/sqrt 2)) with erf as Eigen's rational
// approximation (as variants/fast_ops.gelu); layer norm two-pass (mean, then the mean of squared
// deviations: no E[x^2] - mean^2 cancellation). AVX2+FMA code (compiled from the same loops in a
// target("avx2,fma") clone, chosen at run time) and a portable build of the same loops.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "fused_common.h"  // row loops, GEMM, the helper thread
#include "fused_layer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

namespace {

using Args = FusedArgs;  // fused_layer.h

// quantized layers: rows [lo, hi) of projection j into the scratch buffer at row `at`
// (qpanels: as 16-column panels, part p's rows through its own 16-row staging buffer)
FL_INLINE void dequant_part(const Args& a, int j, int64_t at, int lo, int hi, int p) {
  if (!a.qw || hi <= lo) return;
  float* dst = a.wbuf + (at + lo) * a.qw[j].in;
  if (a.qpanels)
    qk_dequant_panels(a.qw[j], dst, lo, hi, a.qtmp + int64_t(p) * 16 * std::max(a.d, a.f));
  else
    qk_dequant(a.qw[j], dst, lo, hi);
}


// The layer in six phases; part p (of n) of a phase touches only its own heads, columns or
// rows, so the parts of a phase can run at once; the phases follow each other.
FL_INLINE void phase(const Args& a, int k, int p, int n) {
  const int N = a.rows, D = a.d, F = a.f, hd = D / a.heads, D3 = 3 * D;
  const bool tb = a.qw && !a.qpanels;  // quantized: B^T from (N, K) rows (else the panels)
  int lo, hi;
  if (k == 0) {  // q|k|v for this part's heads (+ b_q), then their attention
    int h0, h1;
    cut(a.heads, 1, p, n, h0, h1);
    lo = h0 * hd, hi = h1 * hd;
    const bool tq = a.qw != nullptr;  // quantized: (x W^T + b) per projection, q then scaled
    for (int j = 0; j < 3; ++j) {
      float* c = a.qkv + j * D;
      dequant_part(a, j, int64_t(j) * D, lo, hi, p);
      fill_cols(c, j == 0 ? a.b_q : (j == 1 ? a.b_k : a.b_v), N, lo, hi, D3);
      gemm_acc(N, hi - lo, D, a.x, D, a.w_qkv, D3, j * D + lo, a.p_qkv, c + lo, D3, a.avx2, tb);
      if (tq && j == 0)
        for (int i = 0; i < N; ++i) {
          float* ci = c + int64_t(i) * D3;
          for (int t = lo; t < hi; ++t) ci[t] *= a.q_scale;
        }
    }
    attend_heads(a.qkv, a.ctx, a.scores + int64_t(p) * a.lmax * a.lmax, a.lens, a.n_seqs, a.kb,
                 D, hd, h0, h1, a.lmax);
  } else if (k == 1) {  // h = ctx Wo + bo, this part's columns
    cut(D, 16, p, n, lo, hi);
    dequant_part(a, 3, 0, lo, hi, p);
    fill_cols(a.h, a.b_o, N, lo, hi, D);
    gemm_acc(N, hi - lo, D, a.ctx, D, a.w_o, D, lo, a.p_o, a.h + lo, D, a.avx2, tb);
  } else if (k == 2) {  // h = LN1(x + h), this part's rows
    cut(N, 1, p, n, lo, hi);
    for (int i = lo; i < hi; ++i) {
      float* r = a.h + int64_t(i) * D;
      add_layer_norm_row(a.x + int64_t(i) * D, r, a.g1, a.be1, a.eps1, r, D);
    }
  } else if (k == 3) {  // inter = act(h Wi + bi), this part's columns
    cut(F, 16, p, n, lo, hi);
    dequant_part(a, 4, 0, lo, hi, p);
    fill_cols(a.inter, a.b_i, N, lo, hi, F);
    gemm_acc(N, hi - lo, D, a.h, D, a.w_i, F, lo, a.p_i, a.inter + lo, F, a.avx2, tb);
    for (int i = 0; i < N; ++i) {
      float* t = a.inter + int64_t(i) * F;
      if (a.act == 0) {
#pragma omp simd
        for (int j = lo; j < hi; ++j) t[j] = gelu_erf(t[j]);
      } else {
#pragma omp simd
        for (int j = lo; j < hi; ++j) t[j] = t[j] > 0.0f ? t[j] : 0.0f;
      }
    }
  } else if (k == 4) {  // y = inter Wu + bu, this part's columns
    cut(D, 16, p, n, lo, hi);
    dequant_part(a, 5, 0, lo, hi, p);
    fill_cols(a.y, a.b_u, N, lo, hi, D);
    gemm_acc(N, hi - lo, F, a.inter, F, a.w_u, D, lo, a.p_u, a.y + lo, D, a.avx2, tb);
  } else {  // y = LN2(h + y), this part's rows
    cut(N, 1, p, n, lo, hi);
    for (int i = lo; i < hi; ++i) {
      float* r = a.y + int64_t(i) * D;
      add_layer_norm_row(a.h + int64_t(i) * D, r, a.g2, a.be2, a.eps2, r, D);
    }
  }
}

constexpr int kPhases = 6;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FL_HAVE_AVX2 1
__attribute__((target("avx2,fma"))) void phase_avx2(const Args& a, int k, int p, int n) {
  phase(a, k, p, n);
}
#endif

void phase_portable(const Args& a, int k, int p, int n) { phase(a, k, p, n); }

void run_phase(const void* v, int k, int p, int n) {
  const Args& a = *static_cast<const Args*>(v);
#ifdef FL_HAVE_AVX2
  if (a.avx2) return phase_avx2(a, k, p, n);
#endif
  phase_portable(a, k, p, n);
}

// the layer: split in two parts over the helper thread (fused_common.h) when parts >= 2
void run_layer(const Args& a, int parts) { run_parts(run_phase, &a, kPhases, parts); }

std::atomic<bool> g_allow_avx2{true};

bool cpu_has_avx2_fma() {
#ifdef FL_HAVE_AVX2
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

}  // namespace

void fused_run_layer(const FusedArgs& a, int parts) { run_layer(a, parts); }

bool fused_use_avx2() {
  return g_allow_avx2.load(std::memory_order_relaxed) && cpu_has_avx2_fma();
}

class FusedBertLayerCpu : public UnaryPrimitive {
 public:
  FusedBertLayerCpu(Stream s, std::vector<int> lens, bool has_kb, int heads, float eps1,
                    float eps2, int act, int threads)
      : UnaryPrimitive(s), lens_(std::move(lens)), has_kb_(has_kb), heads_(heads),
        eps1_(eps1), eps2_(eps2), act_(act), threads_(threads) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::vector<array> ins;
    for (auto& a : inputs) ins.push_back(array::unsafe_weak_copy(a));
    enc.dispatch([ins = std::move(ins), o = array::unsafe_weak_copy(out), lens = lens_,
                  has_kb = has_kb_, heads = heads_, eps1 = eps1_, eps2 = eps2_, act = act_,
                  threads = threads_]() mutable {
      const int N = ins[0].shape(0), D = ins[0].shape(1);
      int i = has_kb ? 2 : 1;
      auto p = [&](int j) { return ins[j].data<float>(); };
      const int F = ins[i + 6].shape(1);
      const int Lmax = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
      const int parts = threads >= 2 ? 2 : 1;
      const size_t floats = fused_act_floats(N, D, F, Lmax, parts);
      auto buf = allocator::allocator().malloc(floats * sizeof(float));
      float* w = static_cast<float*>(buf.raw_ptr());
      const bool panels = int(ins.size()) == i + 16;
      auto q = [&](int j) { return panels ? p(i + 12 + j) : nullptr; };
      Args a{p(0), has_kb ? p(1) : nullptr, p(i), p(i + 1), p(i + 2), p(i + 3), p(i + 4),
             p(i + 5), p(i + 6), p(i + 7), p(i + 8), p(i + 9), p(i + 10), p(i + 11),
             q(0), q(1), q(2), q(3),
             o.data<float>(), nullptr, nullptr, nullptr, nullptr, nullptr, lens.data(),
             int(lens.size()), N, D, F, heads, act, Lmax, fused_use_avx2(), eps1, eps2};
      fused_set_acts(a, w);
      run_layer(a, parts);
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("FusedBertLayerCpu has no GPU implementation");
  }
  DEFINE_NAME(FusedBertLayerCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FusedBertLayerCpu&>(other);
    return lens_ == o.lens_ && has_kb_ == o.has_kb_ && heads_ == o.heads_ &&
           eps1_ == o.eps1_ && eps2_ == o.eps2_ && act_ == o.act_ && threads_ == o.threads_;
  }

 private:
  std::vector<int> lens_;
  bool has_kb_;
  int heads_;
  float eps1_, eps2_;
  int act_, threads_;
};

namespace {

array contig(const array& a, const Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, s);
}

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("fused_layer: ") + what);
}

}  // namespace

array fused_bert_layer_cpu(const array& x, const std::vector<int>& lens,
                           const std::optional<array>& key_bias, const std::vector<array>& w,
                           int heads, float eps1, float eps2, int act, int threads) {
  auto s = to_stream({});
  need(s.device == Device::cpu, "CPU stream only");
  need(x.dtype() == float32 && x.ndim() == 2, "x must be float32 (rows, D)");
  need(w.size() == 12 || w.size() == 16,
       "weights: w_qkv_t, b_q, w_o_t, b_o, g1, b1, w_i_t, b_i, w_u_t, b_u, g2, b2 [, the four "
       "weights as 16-column panels]");
  const int N = x.shape(0), D = x.shape(1);
  need(heads > 0 && D % heads == 0, "heads must divide D");
  need(act == 0 || act == 1, "act must be 0 (erf GELU) or 1 (ReLU)");
  int64_t total = 0;
  for (int L : lens) {
    need(L >= 0, "lens must be >= 0");
    total += L;
  }
  need(total == N, "lens must sum to the rows of x");
  for (auto& a : w) need(a.dtype() == float32, "weights must be float32");
  const int F = w[6].ndim() == 2 ? w[6].shape(1) : -1;
  need(w[0].ndim() == 2 && w[0].shape(0) == D && w[0].shape(1) == 3 * D, "w_qkv_t (D, 3D)");
  need(w[2].ndim() == 2 && w[2].shape(0) == D && w[2].shape(1) == D, "w_o_t (D, D)");
  need(F > 0 && w[6].shape(0) == D, "w_i_t (D, F)");
  need(w[8].ndim() == 2 && w[8].shape(0) == F && w[8].shape(1) == D, "w_u_t (F, D)");
  for (int j : {1, 3, 4, 5, 9, 10, 11}) need(w[j].ndim() == 1 && w[j].shape(0) == D, "(D,) vectors");
  need(w[7].ndim() == 1 && w[7].shape(0) == F, "b_i (F,)");
  if (w.size() == 16) {  // panels: (N/16, K, 16) of each (K, N) weight
    const int kn[4][2] = {{D, 3 * D}, {D, D}, {D, F}, {F, D}};
    for (int j = 0; j < 4; ++j)
      need(kn[j][1] % 16 == 0 && w[12 + j].ndim() == 3 && w[12 + j].shape(0) == kn[j][1] / 16 &&
               w[12 + j].shape(1) == kn[j][0] && w[12 + j].shape(2) == 16,
           "panels (N/16, K, 16) of w_qkv_t, w_o_t, w_i_t, w_u_t");
  }
  std::vector<array> in = {contig(x, s)};
  if (key_bias) {
    need(key_bias->dtype() == float32 && key_bias->size() == size_t(N), "key_bias (rows,)");
    in.push_back(contig(reshape(*key_bias, {N}, s), s));
  }
  for (auto& a : w) in.push_back(contig(a, s));
  return array({N, D}, float32,
               std::make_shared<FusedBertLayerCpu>(s, lens, bool(key_bias), heads, eps1, eps2,
                                                   act, threads),
               in);
}

void register_fused_layer(nb::module_& m) {
  m.def("fused_bert_layer", &fused_bert_layer_cpu, "x"_a, "lens"_a, "key_bias"_a = nb::none(),
        "weights"_a, "heads"_a, "eps1"_a, "eps2"_a, "act"_a = 0, "threads"_a = 0,
        "One post-norm BERT layer on rows x (N, D) float32 (sequences of `lens` rows end to "
        "end), folded weights (see fused_layer.cpp); CPU stream. -> (N, D).");
  m.def("fused_allow_avx2", [](bool on) { return g_allow_avx2.exchange(on); }, "on"_a,
        "Allow (True, the default) or forbid the AVX2+FMA build of the layer's loops; returns "
        "the previous setting.");
  m.def("fused_has_avx2", &cpu_has_avx2_fma, "Whether the AVX2+FMA loops can run here.");
}

}  // namespace mlx::core
