// ModernBERT's pre-norm layer (fused_mbert_layer.cpp) on W8A8 projections (int8 weights,
// per-token uint8 activations, int32 accumulation) as ONE MLX CPU primitive (mlx-variants;
// variants/arch/modernbert_fused_i8.py is the Python side), as fused_int8_layer.cpp is to the
// BERT layer.
//
// Inputs: rows x (N, D) (sequences of `lens` rows end to end), an optional additive key bias
// per row, the rotary tables (cos, sin), then for each of the four projections (Wqkv (3D, D),
// Wo (D, D), Wi (2F, D), Wout (D, F)) int8_linear's (wq int8, w_scale, colsum int32) plus the
// Linear's fp32 bias or None and SmoothQuant's 1/s (in,) or None, then the norms (g1, b1, g2,
// b2; g1 None: layer 0's identity; b1, b2 None: no bias). The algebra is the plain MLX path's
// for a W8A8 layer (variants/arch/modernbert_layers.py, each Linear an Int8Linear):
//   qkv = Wqkv(h), q scaled by 1/sqrt(head_dim) after the projection, rotary q and k,
//   x1 = x + Wo(Attn(q, k, v)),  y = x1 + Wout(act(Wi(u)[:F]) * Wi(u)[F:]),
//   h = LN1(x), u = LN2(x1),
// each Linear fused_int8.h's quantization, integer GEMM and epilogue (the same codes and values
// as int8_linear for the same input), the attention, window, rotary and norms
// fused_mbert_ops.h's loops. Each GEMM input is quantized once per part: h for the stacked
// q|k|v weight (one GEMM over 3D rows in one part), the attention's output, u for both GeGLU
// halves (one GEMM over Wi's 2F rows in one part), the gated product; the int32 products are
// written over their float32 results and the epilogues (scales, bias, q's scale, the residual,
// GeGLU) convert them in place. `threads` >= 2: each phase split in two parts (heads, output
// columns) over fused_common.h's helper thread, each part quantizing the whole input of its
// GEMM. Scratch (activations, codes, row scales) comes from MLX's allocator.

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

#include "fused_common.h"
#include "fused_int8.h"
#include "fused_mbert.h"
#include "fused_mbert_ops.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

namespace {

constexpr int kProj = 4, kPhases = 4;  // Wqkv, Wo, Wi, Wout

struct MbI8Args {
  MbArgs m;  // x, kb, rotary, norms (w[G1..BE2]), shapes, qkv, ctx, h, scores, y
  I8Proj pr[kProj];  // bias: the Linear's or zeros
  const float* sm[kProj];  // 1/s or null
  float* ig;  // (N, 2F): Wi's two halves, then act(input) * gate in columns [0, F)
  float *rs, *tmp;  // per part: rows scales, one smoothed row (max(D, F))
  int32_t* zp;  // per part: rows zero points
  uint8_t* codes;  // per part: rows x max(D, F) codes
  int wmax;
  float q_scale;
};

// part p's codes, scales, zero points of the rows of x (stride ldx, k inputs)
FL_INLINE void quantize_part(const MbI8Args& a, const float* x, int64_t ldx, int k,
                             const float* sm, int p) {
  const int N = a.m.rows;
  quantize_rows8(x, ldx, N, k, sm, a.tmp + int64_t(p) * a.wmax,
                 a.codes + int64_t(p) * N * a.wmax, a.rs + int64_t(p) * N,
                 a.zp + int64_t(p) * N);
}

// columns [r0, r1) of c (rows, ldc), as int32: part p's codes (k inputs) times the rows
// [r0, r1) of projection g's weight
FL_INLINE void gemm_part(const MbI8Args& a, int g, int k, int r0, int r1, float* c, int ldc,
                         int p) {
  const int N = a.m.rows;
  int8_gemm_rows(N, r1 - r0, k, a.codes + int64_t(p) * N * a.wmax,
                 a.pr[g].w + int64_t(r0) * k, c + r0, ldc,
                 r0 == 0 && r1 == a.pr[g].n ? a.pr[g].packed : nullptr);  // whole weights only
}

// one row's epilogue over columns [c0, c1) (column j: the weight's row j), src the int32
// products (may be dst): MODE 0 dst = v + b, 1 dst = (v + b) * scale, 2 dst = res + (v + b)
template <int MODE>
FL_INLINE void epi_row(const i32a* src, const float* res, float* dst, int c0, int c1, float si,
                       int32_t zi, const I8Proj& pr, float scale) {
  const float *ws = pr.ws, *b = pr.bias;
  const int32_t* cs = pr.colsum;
#pragma omp simd
  for (int j = c0; j < c1; ++j) {
    float v = int8_value(src[j], si, zi, ws[j], cs[j]);
    v = v + b[j];
    if (MODE == 1) v = v * scale;
    if (MODE == 2) v = res[j] + v;
    dst[j] = v;
  }
}

// the epilogue of projection g over columns [c0, c1) of every row (part p's scales)
template <int MODE>
FL_INLINE void epilogue(const MbI8Args& a, int g, int c0, int c1, const float* src, int lds,
                        const float* res, float* dst, int ldd, int p) {
  const int N = a.m.rows;
  const float* rs = a.rs + int64_t(p) * N;
  const int32_t* zp = a.zp + int64_t(p) * N;
  for (int i = 0; i < N; ++i)
    epi_row<MODE>(reinterpret_cast<const i32a*>(src + int64_t(i) * lds),
                  res ? res + int64_t(i) * ldd : nullptr, dst + int64_t(i) * ldd, c0, c1, rs[i],
                  zp[i], a.pr[g], a.q_scale);
}

// GeGLU's epilogue over columns [c0, c1) of ig: act(Wi(u)_j) * Wi(u)_{F+j} into column j
template <int ACT>
FL_INLINE void geglu_epilogue(const MbI8Args& a, int c0, int c1, int p) {
  const int N = a.m.rows, F = a.m.f;
  const float* rs = a.rs + int64_t(p) * N;
  const int32_t* zp = a.zp + int64_t(p) * N;
  const I8Proj& pr = a.pr[2];
  const float *ws = pr.ws, *b = pr.bias;
  const int32_t* cs = pr.colsum;
  for (int i = 0; i < N; ++i) {
    float* row = a.ig + int64_t(i) * 2 * F;
    const i32a* src = reinterpret_cast<const i32a*>(row);
    const float si = rs[i];
    const int32_t zi = zp[i];
#pragma omp simd
    for (int j = c0; j < c1; ++j) {
      const float u = int8_value(src[j], si, zi, ws[j], cs[j]) + b[j];
      const float g = int8_value(src[F + j], si, zi, ws[F + j], cs[F + j]) + b[F + j];
      row[j] = (ACT == 0 ? gelu_erf(u) : act_one(ACT, u)) * g;
    }
  }
}

FL_INLINE void phase(const MbI8Args& a, int k, int p, int n) {
  const MbArgs& m = a.m;
  const int D = m.d, F = m.f, D3 = 3 * D, hd = D / m.heads;
  int lo, hi;
  if (k == 0) {  // h = LN1(x); q|k|v of this part's heads, rotary q, k; their attention
    int h0, h1;
    cut(m.heads, 1, p, n, h0, h1);
    lo = h0 * hd, hi = h1 * hd;
    quantize_part(a, normed(m, m.x, m.w[G1], m.w[BE1], m.eps1, p), D, D, a.sm[0], p);
    if (lo == 0 && hi == D) {  // all heads: one GEMM over the 3D rows
      gemm_part(a, 0, D, 0, D3, m.qkv, D3, p);
      epilogue<1>(a, 0, 0, D, m.qkv, D3, nullptr, m.qkv, D3, p);
      epilogue<0>(a, 0, D, D3, m.qkv, D3, nullptr, m.qkv, D3, p);
    } else {
      for (int j = 0; j < 3; ++j) {
        gemm_part(a, 0, D, j * D + lo, j * D + hi, m.qkv, D3, p);
        if (j == 0)
          epilogue<1>(a, 0, lo, hi, m.qkv, D3, nullptr, m.qkv, D3, p);
        else
          epilogue<0>(a, 0, j * D + lo, j * D + hi, m.qkv, D3, nullptr, m.qkv, D3, p);
      }
    }
    rope_attend(m, h0, h1, p);
  } else if (k == 1) {  // y = x + Wo(ctx), this part's columns
    cut(D, 16, p, n, lo, hi);
    quantize_part(a, m.ctx, D, D, a.sm[1], p);
    gemm_part(a, 1, D, lo, hi, m.y, D, p);
    epilogue<2>(a, 1, lo, hi, m.y, D, m.x, m.y, D, p);
  } else if (k == 2) {  // u = LN2(y); ig = act(Wi(u)[:F]) * Wi(u)[F:], this part's columns
    cut(F, 16, p, n, lo, hi);
    quantize_part(a, normed(m, m.y, m.w[G2], m.w[BE2], m.eps2, p), D, D, a.sm[2], p);
    if (lo == 0 && hi == F) {
      gemm_part(a, 2, D, 0, 2 * F, a.ig, 2 * F, p);
    } else {
      gemm_part(a, 2, D, lo, hi, a.ig, 2 * F, p);
      gemm_part(a, 2, D, F + lo, F + hi, a.ig, 2 * F, p);
    }
    if (m.act == 0)
      geglu_epilogue<0>(a, lo, hi, p);
    else if (m.act == 1)
      geglu_epilogue<1>(a, lo, hi, p);
    else
      geglu_epilogue<2>(a, lo, hi, p);
  } else {  // y += Wout(ig[:, :F]), this part's columns (products in the free qkv buffer)
    cut(D, 16, p, n, lo, hi);
    quantize_part(a, a.ig, 2 * F, F, a.sm[3], p);
    gemm_part(a, 3, F, lo, hi, m.qkv, D, p);
    epilogue<2>(a, 3, lo, hi, m.qkv, D, m.y, m.y, D, p);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MI8_HAVE_AVX2 1
__attribute__((target("avx2,fma"))) void phase_avx2(const MbI8Args& a, int k, int p, int n) {
  phase(a, k, p, n);
}
#endif

void phase_portable(const MbI8Args& a, int k, int p, int n) { phase(a, k, p, n); }

void run_phase(const void* v, int k, int p, int n) {
  const MbI8Args& a = *static_cast<const MbI8Args*>(v);
#ifdef MI8_HAVE_AVX2
  if (a.m.avx2) return phase_avx2(a, k, p, n);
#endif
  phase_portable(a, k, p, n);
}

}  // namespace

class FusedMbertInt8LayerCpu : public UnaryPrimitive {
 public:
  // present: bit j set when optional input j is given: the 4 Linear biases (0-3), their 1/s
  // (4-7), then g1, b1, b2 (8-10)
  FusedMbertInt8LayerCpu(Stream s, std::vector<int> lens, bool has_kb, uint32_t present,
                         int heads, float q_scale, float eps1, float eps2, int act, int half,
                         int threads)
      : UnaryPrimitive(s), lens_(std::move(lens)), has_kb_(has_kb), present_(present),
        heads_(heads), q_scale_(q_scale), eps1_(eps1), eps2_(eps2), act_(act), half_(half),
        threads_(threads) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::vector<array> ins;
    for (auto& a : inputs) ins.push_back(array::unsafe_weak_copy(a));
    enc.dispatch([ins = std::move(ins), o = array::unsafe_weak_copy(out), lens = lens_,
                  has_kb = has_kb_, present = present_, heads = heads_, q_scale = q_scale_,
                  eps1 = eps1_, eps2 = eps2_, act = act_, half = half_,
                  threads = threads_]() mutable {
      MbI8Args a{};
      MbArgs& m = a.m;
      const int N = ins[0].shape(0), D = ins[0].shape(1);
      auto f = [&](int j) { return ins[j].data<float>(); };
      auto bit = [&](int j) { return bool((present >> j) & 1u); };
      int i = 0;
      m.x = f(i++);
      m.kb = has_kb ? f(i++) : nullptr;
      m.cos = f(i++);
      m.sin = f(i++);
      const int F = ins[i + 6].shape(0) / 2;  // Wi (2F, D), the third (w, scale, colsum)
      const float* bias[kProj] = {};
      for (int g = 0; g < kProj; ++g) {
        a.pr[g] = I8Proj{ins[i].data<int8_t>(), f(i + 1), nullptr, ins[i + 2].data<int32_t>(),
                         nullptr, int(ins[i].shape(0))};
        i += 3;
      }
      for (int g = 0; g < kProj; ++g) bias[g] = bit(g) ? f(i++) : nullptr;
      for (int g = 0; g < kProj; ++g) a.sm[g] = bit(4 + g) ? f(i++) : nullptr;
      m.w[G1] = bit(8) ? f(i++) : nullptr;
      m.w[BE1] = bit(9) ? f(i++) : nullptr;
      m.w[G2] = f(i++);
      m.w[BE2] = bit(10) ? f(i++) : nullptr;
      for (int g = 0; g < kProj; ++g)  // int8_prepack's blobs (bits 11..14)
        if (bit(11 + g)) a.pr[g].packed = ins[i++].data<uint8_t>();
      const int parts = threads >= 2 ? 2 : 1;
      const int Lmax = std::max(1, lens.empty() ? 1 : *std::max_element(lens.begin(), lens.end()));
      a.wmax = std::max(D, F);
      const size_t n = size_t(N), zeros = size_t(std::max(3 * D, 2 * F));
      // floats: qkv, ctx, ig, h and scores per part, zeros (absent biases), row scales and a
      // smoothed row per part; then the zero points (int32) and codes (uint8) per part
      const size_t floats = n * (4 * size_t(D) + 2 * size_t(F)) +
                            size_t(parts) * (n * D + size_t(BQ_GLOBAL) * Lmax) + zeros +
                            size_t(parts) * (n + a.wmax);
      const size_t bytes = floats * 4 + size_t(parts) * n * 4 + size_t(parts) * n * a.wmax + 64;
      auto buf = allocator::allocator().malloc(bytes);
      float* w = static_cast<float*>(buf.raw_ptr());
      m.qkv = w;
      m.ctx = w + n * 3 * D;
      a.ig = m.ctx + n * D;
      m.h = a.ig + n * 2 * F;
      m.scores = m.h + size_t(parts) * n * D;
      float* zero = m.scores + size_t(parts) * BQ_GLOBAL * Lmax;
      std::fill(zero, zero + zeros, 0.0f);
      for (int g = 0; g < kProj; ++g) a.pr[g].bias = bias[g] ? bias[g] : zero;
      a.rs = zero + zeros;
      a.tmp = a.rs + size_t(parts) * n;
      a.zp = reinterpret_cast<int32_t*>(a.tmp + size_t(parts) * a.wmax);
      a.codes = reinterpret_cast<uint8_t*>(a.zp + size_t(parts) * n);
      a.q_scale = q_scale;
      m.y = o.data<float>();
      m.lens = lens.data();
      m.n_seqs = int(lens.size());
      m.rows = N, m.d = D, m.f = F, m.heads = heads, m.act = act, m.half = half, m.lmax = Lmax;
      m.avx2 = fused_use_avx2();
      m.eps1 = eps1, m.eps2 = eps2;
      run_parts(run_phase, &a, kPhases, parts);
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("FusedMbertInt8LayerCpu has no GPU implementation");
  }
  DEFINE_NAME(FusedMbertInt8LayerCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FusedMbertInt8LayerCpu&>(other);
    return lens_ == o.lens_ && has_kb_ == o.has_kb_ && present_ == o.present_ &&
           heads_ == o.heads_ && q_scale_ == o.q_scale_ && eps1_ == o.eps1_ &&
           eps2_ == o.eps2_ && act_ == o.act_ && half_ == o.half_ && threads_ == o.threads_;
  }

 private:
  std::vector<int> lens_;
  bool has_kb_;
  uint32_t present_;
  int heads_;
  float q_scale_, eps1_, eps2_;
  int act_, half_, threads_;
};

namespace {

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("fused_mbert_int8layer: ") + what);
}

bool vec_of(const std::optional<array>& a, Dtype dt, int n) {
  return a && a->dtype() == dt && a->ndim() == 1 && a->shape(0) == n;
}

}  // namespace

array fused_mbert_int8layer_cpu(const array& x, const std::vector<int>& lens,
                                const std::optional<array>& key_bias, const array& cos,
                                const array& sin, const std::vector<std::optional<array>>& proj,
                                const std::vector<std::optional<array>>& smooth,
                                const std::vector<std::optional<array>>& norms, int heads,
                                float q_scale, float eps1, float eps2, int act, int half,
                                int threads, const std::vector<std::optional<array>>& packed) {
  if (!int8_has_dnnl()) throw std::runtime_error("fused_mbert_int8layer: built without oneDNN");
  auto s = to_stream({});
  need(s.device == Device::cpu, "CPU stream only");
  need(proj.size() == 4 * kProj,
       "proj: (wq int8, w_scale, colsum int32, bias or None) of Wqkv, Wo, Wi, Wout");
  need(smooth.size() == kProj, "smooth: 4 entries (1/s (in,) or None) of Wqkv, Wo, Wi, Wout");
  need(norms.size() == 4, "norms: g1, b1, g2, b2 (g1, b1, b2 may be None)");
  fused_mbert_check("fused_mbert_int8layer", x, lens, cos, sin, heads, act);
  const int N = x.shape(0), D = x.shape(1);
  const auto& wi = proj[8];
  need(wi && wi->ndim() == 2 && wi->shape(0) % 2 == 0 && wi->shape(0) > 0, "Wi (2F, D) int8");
  const int F = wi->shape(0) / 2;
  const int outs[kProj] = {3 * D, D, 2 * F, D}, ins_[kProj] = {D, D, D, F};
  uint32_t present = 0;
  for (int g = 0; g < kProj; ++g) {
    const auto& w = proj[4 * g];
    need(w && w->dtype() == int8 && w->ndim() == 2 && w->shape(0) == outs[g] &&
             w->shape(1) == ins_[g],
         "weights int8: Wqkv (3D, D), Wo (D, D), Wi (2F, D), Wout (D, F)");
    need(vec_of(proj[4 * g + 1], float32, outs[g]) && vec_of(proj[4 * g + 2], int32, outs[g]),
         "each w_scale float32 (out,), colsum int32 (out,)");
    need(!proj[4 * g + 3] || vec_of(proj[4 * g + 3], float32, outs[g]),
         "each bias float32 (out,) or None");
    need(!smooth[g] || vec_of(smooth[g], float32, ins_[g]), "each 1/s float32 (in,) or None");
    if (proj[4 * g + 3]) present |= 1u << g;
    if (smooth[g]) present |= 1u << (4 + g);
  }
  need(norms[2].has_value() && (norms[0] || !norms[1]), "g2 required; b1 only with g1");
  for (auto& g : norms) need(!g || vec_of(g, float32, D), "norms float32 (D,)");
  std::vector<array> in = {contiguous(x, false, s)};
  if (key_bias) {
    need(key_bias->dtype() == float32 && key_bias->size() == size_t(N), "key_bias (rows,)");
    in.push_back(contiguous(reshape(*key_bias, {N}, s), false, s));
  }
  in.push_back(contiguous(cos, false, s));
  in.push_back(contiguous(sin, false, s));
  for (int g = 0; g < kProj; ++g)
    for (int t = 0; t < 3; ++t) in.push_back(contiguous(*proj[4 * g + t], false, s));
  for (int g = 0; g < kProj; ++g)
    if (proj[4 * g + 3]) in.push_back(contiguous(*proj[4 * g + 3], false, s));
  for (int g = 0; g < kProj; ++g)
    if (smooth[g]) in.push_back(contiguous(*smooth[g], false, s));
  const int bit_of[4] = {8, 9, -1, 10};  // g1, b1, (g2 always), b2
  for (int t = 0; t < 4; ++t) {
    if (!norms[t]) continue;
    if (bit_of[t] >= 0) present |= 1u << bit_of[t];
    in.push_back(contiguous(*norms[t], false, s));
  }
  need(packed.empty() || packed.size() == kProj, "packed: none or 4 entries (or None)");
  for (size_t g = 0; g < packed.size(); ++g) {
    if (!packed[g]) continue;
    need(vec_of(packed[g], uint8, int(int8_prepack_bytes(outs[g], ins_[g]))),
         "each packed entry int8_prepack(wq) of its weight (uint8) or None");
    present |= 1u << (11 + g);
    in.push_back(contiguous(*packed[g], false, s));
  }
  return array({N, D}, float32,
               std::make_shared<FusedMbertInt8LayerCpu>(s, lens, bool(key_bias), present, heads,
                                                        q_scale, eps1, eps2, act, half, threads),
               in);
}

void register_fused_mbert_int8layer(nb::module_& m) {
  m.def("fused_mbert_int8layer", &fused_mbert_int8layer_cpu, "x"_a, "lens"_a,
        "key_bias"_a = nb::none(), "cos"_a, "sin"_a, "proj"_a, "smooth"_a, "norms"_a, "heads"_a,
        "q_scale"_a, "eps1"_a, "eps2"_a, "act"_a = 0, "half"_a = -1, "threads"_a = 0,
        "packed"_a = std::vector<std::optional<array>>{},
        "One ModernBERT pre-norm layer on rows x (N, D) float32 with W8A8 projections on "
        "oneDNN's integer GEMM (see fused_mbert_int8layer.cpp; packed: [] or int8_prepack's blobs "
        "of the 4 weights, entries may be None); half: the local window's half "
        "width, -1 global; CPU stream. -> (N, D).");
}

}  // namespace mlx::core
