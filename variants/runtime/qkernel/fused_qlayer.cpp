// The post-norm BERT layer of fused_layer.cpp on affine-quantized projections, as ONE MLX CPU
// primitive (mlx-variants; variants/fused_layer.py's qweights / forward are the Python side).
//
// Inputs: rows x (N, D) (sequences of `lens` rows end to end, as fused_layer.cpp), an optional
// additive key bias per row, and for each of the six projections (query, key, value, out,
// intermediate, output) mx.quantize's (w uint32, scales, biases: float32, float16 or bfloat16,
// widened exactly per group as qkernel.cpp does) with its own group size and
// bit width (mixed-precision layers) plus the Linear's fp32 bias; then the two layer norms'
// (gamma, beta). The algebra is the MLX path's for a quantized layer (not the folded one):
//   q = (x Wq^T + bq) * scale, k = x Wk^T + bk, v = x Wv^T + bv,
//   h = LN1(x + Attn(q, k, v) Wo^T + bo),  y = LN2(h + act(h Wi^T + bi) Wu^T + bu),
// the attention, softmax, activation and layer norms being fused_layer.cpp's loops. Each
// phase part dequantizes the weight rows it multiplies (qkernel.cpp's loop, bit-identical to
// mx.dequantize) into one scratch buffer of max(3D, F) x D floats, then cblas_sgemm with B^T.
// That buffer and the activations come from MLX's allocator: they count in
// mx.get_peak_memory() (the buffer is as large as the largest single-Linear buffer of
// qkernel.cpp's qlinear, 3 D^2 for the stacked q|k|v rows or F D, not the sum of six).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "fused_layer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

void qk_check_args(const array& w, const array& scales, const array& biases, int group_size,
                   int bits);  // qkernel.cpp
// the projection's QProj (its scales' dtype as stype; qkernel.cpp)
QProj qk_proj(const array& w, const array& scales, const array& biases, int group_size,
              int bits);

namespace {

constexpr int kProj = 6;  // query, key, value, out, intermediate, output

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("fused_qlayer: ") + what);
}

array contig(const array& a, const Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, s);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// 16 staged rows (16, in) -> one (in, 16) panel: 8x8 blocks transposed in AVX registers
__attribute__((target("avx2"))) void to_panel_avx2(const float* t, float* P, int64_t in) {
  for (int64_t k = 0; k < in; k += 8)
    for (int h = 0; h < 16; h += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(t + (h + i) * in + k);
      __m256 u0 = _mm256_unpacklo_ps(r[0], r[1]), u1 = _mm256_unpackhi_ps(r[0], r[1]);
      __m256 u2 = _mm256_unpacklo_ps(r[2], r[3]), u3 = _mm256_unpackhi_ps(r[2], r[3]);
      __m256 u4 = _mm256_unpacklo_ps(r[4], r[5]), u5 = _mm256_unpackhi_ps(r[4], r[5]);
      __m256 u6 = _mm256_unpacklo_ps(r[6], r[7]), u7 = _mm256_unpackhi_ps(r[6], r[7]);
      __m256 s0 = _mm256_shuffle_ps(u0, u2, 0x44), s1 = _mm256_shuffle_ps(u0, u2, 0xEE);
      __m256 s2 = _mm256_shuffle_ps(u1, u3, 0x44), s3 = _mm256_shuffle_ps(u1, u3, 0xEE);
      __m256 s4 = _mm256_shuffle_ps(u4, u6, 0x44), s5 = _mm256_shuffle_ps(u4, u6, 0xEE);
      __m256 s6 = _mm256_shuffle_ps(u5, u7, 0x44), s7 = _mm256_shuffle_ps(u5, u7, 0xEE);
      const __m256 c[8] = {
          _mm256_permute2f128_ps(s0, s4, 0x20), _mm256_permute2f128_ps(s1, s5, 0x20),
          _mm256_permute2f128_ps(s2, s6, 0x20), _mm256_permute2f128_ps(s3, s7, 0x20),
          _mm256_permute2f128_ps(s0, s4, 0x31), _mm256_permute2f128_ps(s1, s5, 0x31),
          _mm256_permute2f128_ps(s2, s6, 0x31), _mm256_permute2f128_ps(s3, s7, 0x31)};
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(P + (k + i) * 16 + h, c[i]);
    }
}
#endif

}  // namespace

void qk_dequant_panels(const QProj& q, float* dst, int64_t r0, int64_t r1, float* tmp) {
  for (int64_t r = r0; r < r1; r += 16) {
    qk_dequant(q, tmp, r, r + 16);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    to_panel_avx2(tmp, dst + (r - r0) * q.in, q.in);
#else
    throw std::logic_error("fused_qlayer: panels need AVX2");
#endif
  }
}

class FusedBertQLayerCpu : public UnaryPrimitive {
 public:
  FusedBertQLayerCpu(Stream s, std::vector<int> lens, bool has_kb, int heads, float eps1,
                     float eps2, int act, int threads, float q_scale, std::vector<int> gs,
                     std::vector<int> bits, bool panels)
      : UnaryPrimitive(s), lens_(std::move(lens)), has_kb_(has_kb), heads_(heads), eps1_(eps1),
        eps2_(eps2), act_(act), threads_(threads), q_scale_(q_scale), gs_(std::move(gs)),
        bits_(std::move(bits)), panels_(panels) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::vector<array> ins;
    for (auto& a : inputs) ins.push_back(array::unsafe_weak_copy(a));
    enc.dispatch([ins = std::move(ins), o = array::unsafe_weak_copy(out), lens = lens_,
                  has_kb = has_kb_, heads = heads_, eps1 = eps1_, eps2 = eps2_, act = act_,
                  threads = threads_, q_scale = q_scale_, gs = gs_, bits = bits_,
                  panels = panels_]() mutable {
      const int N = ins[0].shape(0), D = ins[0].shape(1);
      const int i = has_kb ? 2 : 1, n = i + 4 * kProj;  // projections, then the norms
      auto f = [&](int j) { return ins[j].data<float>(); };
      const int F = ins[i + 4 * 4].shape(0);
      QProj q[kProj];
      for (int j = 0; j < kProj; ++j)
        q[j] = qk_proj(ins[i + 4 * j], ins[i + 4 * j + 1], ins[i + 4 * j + 2], gs[j], bits[j]);
      auto b = [&](int j) { return f(i + 4 * j + 3); };
      const int Lmax = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
      const int parts = threads >= 2 ? 2 : 1;
      const size_t acts = fused_act_floats(N, D, F, Lmax, parts);
      const size_t wfloats = size_t(std::max(3 * D, F)) * D;
      // panels (few rows): the kernel's own GEMM on W^T in 16-column panels, where it runs
      // (AVX2+FMA, every part's rows on a panel edge), else OpenBLAS on the (N, K) rows
      const bool pan = panels && fused_use_avx2() && D % 16 == 0 && F % 16 == 0 &&
                       (parts == 1 || (D / heads) % 16 == 0);
      const size_t tfloats = pan ? size_t(parts) * 16 * std::max(D, F) : 0;
      auto buf = allocator::allocator().malloc((acts + wfloats + tfloats) * sizeof(float));
      float* w = static_cast<float*>(buf.raw_ptr());
      float* wb = w + acts;
      float* pw = pan ? wb : nullptr;
      FusedArgs a{f(0), has_kb ? f(1) : nullptr, wb, b(0), wb, b(3), f(n), f(n + 1), wb, b(4),
                  wb, b(5), f(n + 2), f(n + 3), pw, pw, pw, pw,
                  o.data<float>(), nullptr, nullptr, nullptr, nullptr, nullptr, lens.data(),
                  int(lens.size()), N, D, F, heads, act, Lmax, fused_use_avx2(), eps1, eps2,
                  q, wb, b(1), b(2), q_scale, pan, wb + wfloats};
      fused_set_acts(a, w);
      fused_run_layer(a, parts);
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("FusedBertQLayerCpu has no GPU implementation");
  }
  DEFINE_NAME(FusedBertQLayerCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FusedBertQLayerCpu&>(other);
    return lens_ == o.lens_ && has_kb_ == o.has_kb_ && heads_ == o.heads_ && eps1_ == o.eps1_ &&
           eps2_ == o.eps2_ && act_ == o.act_ && threads_ == o.threads_ &&
           q_scale_ == o.q_scale_ && gs_ == o.gs_ && bits_ == o.bits_ && panels_ == o.panels_;
  }

 private:
  std::vector<int> lens_;
  bool has_kb_;
  int heads_;
  float eps1_, eps2_;
  int act_, threads_;
  float q_scale_;
  std::vector<int> gs_, bits_;
  bool panels_;
};

array fused_bert_qlayer_cpu(const array& x, const std::vector<int>& lens,
                            const std::optional<array>& key_bias, const std::vector<array>& proj,
                            const std::vector<int>& group_sizes, const std::vector<int>& bits,
                            const std::vector<array>& norms, int heads, float q_scale,
                            float eps1, float eps2, int act, int threads, bool panels) {
  auto s = to_stream({});
  need(s.device == Device::cpu, "CPU stream only");
  need(x.dtype() == float32 && x.ndim() == 2, "x must be float32 (rows, D)");
  need(proj.size() == 4 * kProj && group_sizes.size() == kProj && bits.size() == kProj,
       "proj: (w, scales, biases, bias) of query, key, value, out, intermediate, output; "
       "group_sizes and bits: 6 each");
  need(norms.size() == 4, "norms: g1, b1, g2, b2");
  const int N = x.shape(0), D = x.shape(1);
  need(heads > 0 && D % heads == 0, "heads must divide D");
  need(act == 0 || act == 1, "act must be 0 (erf GELU) or 1 (ReLU)");
  int64_t total = 0;
  for (int L : lens) {
    need(L >= 0, "lens must be >= 0");
    total += L;
  }
  need(total == N, "lens must sum to the rows of x");
  const int F = proj[4 * 4].ndim() == 2 ? proj[4 * 4].shape(0) : -1;
  need(F > 0, "intermediate weight (F, packed)");
  const int outs[kProj] = {D, D, D, D, F, D}, ins_[kProj] = {D, D, D, D, D, F};
  for (int j = 0; j < kProj; ++j) {
    const array &w = proj[4 * j], &sc = proj[4 * j + 1], &bi = proj[4 * j + 2],
                &bias = proj[4 * j + 3];
    qk_check_args(w, sc, bi, group_sizes[j], bits[j]);
    need(w.shape(0) == outs[j] && int64_t(sc.shape(1)) * group_sizes[j] == ins_[j],
         "projection shapes: query/key/value/out (D, D), intermediate (F, D), output (D, F)");
    need(bias.dtype() == float32 && bias.ndim() == 1 && bias.shape(0) == outs[j],
         "each projection's bias float32 (out,)");
  }
  for (auto& g : norms) need(g.dtype() == float32 && g.ndim() == 1 && g.shape(0) == D,
                             "norms float32 (D,)");
  std::vector<array> in = {contig(x, s)};
  if (key_bias) {
    need(key_bias->dtype() == float32 && key_bias->size() == size_t(N), "key_bias (rows,)");
    in.push_back(contig(reshape(*key_bias, {N}, s), s));
  }
  for (auto& a : proj) in.push_back(contig(a, s));
  for (auto& a : norms) in.push_back(contig(a, s));
  return array({N, D}, float32,
               std::make_shared<FusedBertQLayerCpu>(s, lens, bool(key_bias), heads, eps1, eps2,
                                                    act, threads, q_scale, group_sizes, bits,
                                                    panels),
               in);
}

void register_fused_qlayer(nb::module_& m) {
  m.def("fused_bert_qlayer", &fused_bert_qlayer_cpu, "x"_a, "lens"_a,
        "key_bias"_a = nb::none(), "proj"_a, "group_sizes"_a, "bits"_a, "norms"_a, "heads"_a,
        "q_scale"_a, "eps1"_a, "eps2"_a, "act"_a = 0, "threads"_a = 0, "panels"_a = false,
        "One post-norm BERT layer on rows x (N, D) float32 with quantized projections "
        "(see fused_qlayer.cpp); panels: the kernel's small-M GEMM on weights dequantized into "
        "16-column panels (few rows); CPU stream. -> (N, D).");
}

}  // namespace mlx::core
