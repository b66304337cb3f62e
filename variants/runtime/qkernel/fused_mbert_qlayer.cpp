// ModernBERT's pre-norm layer (fused_mbert_layer.cpp) on affine-quantized projections, as ONE
// MLX CPU primitive (mlx-variants; variants/modernbert_fused_q.py is the Python side), as
// fused_qlayer.cpp is to fused_layer.cpp.
//
// Inputs: rows x (N, D) (sequences of `lens` rows end to end), an optional additive key bias
// per row, the rotary tables (cos, sin), then for each of the four projections (Wqkv (3D, D),
// Wo (D, D), Wi (2F, D), Wout (D, F)) mx.quantize's (w uint32, scales, biases: float32, float16
// or bfloat16, widened exactly per group as qkernel.cpp does) with its own
// group size and bit width plus the Linear's fp32 bias or None, then the norms (g1, b1, g2,
// b2; g1 None: layer 0's identity; b1, b2 None: no bias). The algebra is the plain MLX path's
// for a quantized layer (variants/modernbert_layers.py; not the folded weights):
//   qkv = h Wqkv^T + b, q scaled by 1/sqrt(head_dim) after the projection, rotary q and k,
//   x1 = x + Attn(q, k, v) Wo^T + bo,  y = x1 + (act(u Wi[:F]^T + bi[:F]) * (u Wi[F:]^T +
//   bi[F:])) Wout^T + bout,  h = LN1(x), u = LN2(x1),
// attention, window, softmax, activation and norms being fused_mbert_layer.cpp's loops. Each
// phase part dequantizes the weight rows it multiplies (qkernel.cpp's loop, bit-identical to
// mx.dequantize) into one scratch buffer of max(3D, 2F) x D floats at their own row offset,
// then cblas_sgemm with B^T (or, `panels` and AVX2, as 16-column panels for the kernel's
// small-row GEMM). The buffer and the activations come from MLX's allocator: they count in
// mx.get_peak_memory() (the buffer is as large as the largest single Linear's buffer in
// qkernel.cpp's qlinear: Wqkv's or Wi's rows, not the sum of four).

#include <algorithm>
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

#include "fused_mbert.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

void qk_check_args(const array& w, const array& scales, const array& biases, int group_size,
                   int bits);  // qkernel.cpp
// the projection's QProj (its scales' dtype as stype; qkernel.cpp)
QProj qk_proj(const array& w, const array& scales, const array& biases, int group_size,
              int bits);

namespace {

constexpr int kProj = 4;  // Wqkv, Wo, Wi, Wout

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("fused_mbert_qlayer: ") + what);
}

}  // namespace

class FusedMbertQLayerCpu : public UnaryPrimitive {
 public:
  // present: bit j set when optional input j (the 4 Linear biases, then g1, b1, b2) is given
  FusedMbertQLayerCpu(Stream s, std::vector<int> lens, bool has_kb, uint32_t present, int heads,
                      float q_scale, float eps1, float eps2, int act, int half, int threads,
                      std::vector<int> gs, std::vector<int> bits, bool panels)
      : UnaryPrimitive(s), lens_(std::move(lens)), has_kb_(has_kb), present_(present),
        heads_(heads), q_scale_(q_scale), eps1_(eps1), eps2_(eps2), act_(act), half_(half),
        threads_(threads), gs_(std::move(gs)), bits_(std::move(bits)), panels_(panels) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::vector<array> ins;
    for (auto& a : inputs) ins.push_back(array::unsafe_weak_copy(a));
    enc.dispatch([ins = std::move(ins), o = array::unsafe_weak_copy(out), lens = lens_,
                  has_kb = has_kb_, present = present_, heads = heads_, q_scale = q_scale_,
                  eps1 = eps1_, eps2 = eps2_, act = act_, half = half_, threads = threads_,
                  gs = gs_, bits = bits_, panels = panels_]() mutable {
      MbArgs a{};
      const int N = ins[0].shape(0), D = ins[0].shape(1);
      int i = 0;
      a.x = ins[i++].data<float>();
      a.kb = has_kb ? ins[i++].data<float>() : nullptr;
      a.cos = ins[i++].data<float>();
      a.sin = ins[i++].data<float>();
      QProj q[kProj];
      const float* bias[kProj] = {};
      int F = 0;
      for (int j = 0; j < kProj; ++j) {
        const array& w = ins[i];
        if (j == 2) F = w.shape(0) / 2;  // Wi (2F, packed)
        q[j] = qk_proj(w, ins[i + 1], ins[i + 2], gs[j], bits[j]);
        i += 3;
        if ((present >> j) & 1u) bias[j] = ins[i++].data<float>();
      }
      a.w[BQKV] = bias[0], a.w[BO] = bias[1], a.w[BOUT] = bias[3];
      a.w[BIN] = bias[2], a.w[BG] = bias[2] ? bias[2] + F : nullptr;
      a.w[G1] = ((present >> 4) & 1u) ? ins[i++].data<float>() : nullptr;
      a.w[BE1] = ((present >> 5) & 1u) ? ins[i++].data<float>() : nullptr;
      a.w[G2] = ins[i++].data<float>();
      a.w[BE2] = ((present >> 6) & 1u) ? ins[i++].data<float>() : nullptr;
      const int parts = threads >= 2 ? 2 : 1;
      // panels (few rows): the kernel's own GEMM where it runs (AVX2+FMA, every part's rows
      // on a panel edge), else OpenBLAS on the (N, K) rows
      const bool pan = panels && fused_use_avx2() && D % 16 == 0 && F % 16 == 0 &&
                       (parts == 1 || (D / heads) % 16 == 0);
      const size_t wfloats = size_t(std::max(3 * D, 2 * F)) * D;
      const size_t tfloats = pan ? size_t(parts) * 16 * std::max(D, F) : 0;
      auto buf = allocator::allocator().malloc((wfloats + tfloats) * sizeof(float));
      a.wbuf = static_cast<float*>(buf.raw_ptr());
      a.qtmp = pan ? a.wbuf + wfloats : nullptr;
      a.qw = q;
      a.q_scale = q_scale;
      a.qpanels = pan;
      a.y = o.data<float>();
      a.lens = lens.data();
      a.n_seqs = int(lens.size());
      a.rows = N, a.d = D, a.f = F, a.heads = heads, a.act = act, a.half = half;
      a.avx2 = fused_use_avx2();
      a.eps1 = eps1, a.eps2 = eps2;
      fused_mbert_run(a, parts);
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("FusedMbertQLayerCpu has no GPU implementation");
  }
  DEFINE_NAME(FusedMbertQLayerCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FusedMbertQLayerCpu&>(other);
    return lens_ == o.lens_ && has_kb_ == o.has_kb_ && present_ == o.present_ &&
           heads_ == o.heads_ && q_scale_ == o.q_scale_ && eps1_ == o.eps1_ &&
           eps2_ == o.eps2_ && act_ == o.act_ && half_ == o.half_ && threads_ == o.threads_ &&
           gs_ == o.gs_ && bits_ == o.bits_ && panels_ == o.panels_;
  }

 private:
  std::vector<int> lens_;
  bool has_kb_;
  uint32_t present_;
  int heads_;
  float q_scale_, eps1_, eps2_;
  int act_, half_, threads_;
  std::vector<int> gs_, bits_;
  bool panels_;
};

array fused_mbert_qlayer_cpu(const array& x, const std::vector<int>& lens,
                             const std::optional<array>& key_bias, const array& cos,
                             const array& sin, const std::vector<std::optional<array>>& proj,
                             const std::vector<int>& group_sizes, const std::vector<int>& bits,
                             const std::vector<std::optional<array>>& norms, int heads,
                             float q_scale, float eps1, float eps2, int act, int half,
                             int threads, bool panels) {
  auto s = to_stream({});
  need(s.device == Device::cpu, "CPU stream only");
  need(proj.size() == 4 * kProj && group_sizes.size() == kProj && bits.size() == kProj,
       "proj: (w, scales, biases, bias or None) of Wqkv, Wo, Wi, Wout; group_sizes and bits: "
       "4 each");
  need(norms.size() == 4, "norms: g1, b1, g2, b2 (g1, b1, b2 may be None)");
  fused_mbert_check("fused_mbert_qlayer", x, lens, cos, sin, heads, act);
  const int N = x.shape(0), D = x.shape(1);
  for (int j = 0; j < 3 * kProj; ++j)
    need(proj[4 * (j / 3) + j % 3].has_value(), "each projection's w, scales, biases");
  const int F2 = proj[8]->ndim() == 2 ? proj[8]->shape(0) : -1;
  need(F2 > 0 && F2 % 2 == 0, "Wi (2F, packed)");
  const int F = F2 / 2;
  const int outs[kProj] = {3 * D, D, 2 * F, D}, ins_[kProj] = {D, D, D, F};
  uint32_t present = 0;
  for (int j = 0; j < kProj; ++j) {
    const array &w = *proj[4 * j], &sc = *proj[4 * j + 1], &bi = *proj[4 * j + 2];
    qk_check_args(w, sc, bi, group_sizes[j], bits[j]);
    need(w.shape(0) == outs[j] && int64_t(sc.shape(1)) * group_sizes[j] == ins_[j],
         "projection shapes: Wqkv (3D, D), Wo (D, D), Wi (2F, D), Wout (D, F)");
    const auto& b = proj[4 * j + 3];
    need(!b || (b->dtype() == float32 && b->ndim() == 1 && b->shape(0) == outs[j]),
         "each projection's bias float32 (out,) or None");
    if (b) present |= 1u << j;
  }
  need(norms[2].has_value() && (norms[0] || !norms[1]), "g2 required; b1 only with g1");
  for (auto& g : norms)
    need(!g || (g->dtype() == float32 && g->ndim() == 1 && g->shape(0) == D),
         "norms float32 (D,)");
  std::vector<array> in = {contiguous(x, false, s)};
  if (key_bias) {
    need(key_bias->dtype() == float32 && key_bias->size() == size_t(N), "key_bias (rows,)");
    in.push_back(contiguous(reshape(*key_bias, {N}, s), false, s));
  }
  in.push_back(contiguous(cos, false, s));
  in.push_back(contiguous(sin, false, s));
  for (int j = 0; j < kProj; ++j)
    for (int t = 0; t < 4; ++t)
      if (proj[4 * j + t]) in.push_back(contiguous(*proj[4 * j + t], false, s));
  const int bit_of[4] = {4, 5, -1, 6};  // g1, b1, (g2 always), b2
  for (int t = 0; t < 4; ++t) {
    if (!norms[t]) continue;
    if (bit_of[t] >= 0) present |= 1u << bit_of[t];
    in.push_back(contiguous(*norms[t], false, s));
  }
  return array({N, D}, float32,
               std::make_shared<FusedMbertQLayerCpu>(s, lens, bool(key_bias), present, heads,
                                                     q_scale, eps1, eps2, act, half, threads,
                                                     group_sizes, bits, panels),
               in);
}

void register_fused_mbert_qlayer(nb::module_& m) {
  m.def("fused_mbert_qlayer", &fused_mbert_qlayer_cpu, "x"_a, "lens"_a,
        "key_bias"_a = nb::none(), "cos"_a, "sin"_a, "proj"_a, "group_sizes"_a, "bits"_a,
        "norms"_a, "heads"_a, "q_scale"_a, "eps1"_a, "eps2"_a, "act"_a = 0, "half"_a = -1,
        "threads"_a = 0, "panels"_a = false,
        "One ModernBERT pre-norm layer on rows x (N, D) float32 with quantized projections "
        "(see fused_mbert_qlayer.cpp); half: the local window's half width, -1 global; "
        "panels: the kernel's small-row GEMM on weights dequantized into 16-column panels; "
        "CPU stream. -> (N, D).");
}

}  // namespace mlx::core
