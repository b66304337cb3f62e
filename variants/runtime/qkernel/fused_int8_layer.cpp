// The post-norm BERT layer of fused_layer.cpp on W8A8 projections (int8 weights, per-token
// uint8 activations, int32 accumulation) as ONE MLX CPU primitive (mlx-variants;
// variants/fused_layer.py's i8weights / forward are the Python side).
//
// Each projection is int8_linear.cpp's arithmetic, unchanged: its input rows (times
// SmoothQuant's 1/s per input channel when given) quantized per row to uint8 (scale =
// (hi - lo) / 255 over [min(x, 0), max(x, 0)], zero point round(-lo / scale), codes
// clamp(round(x / scale) + zp, 0, 255), round half to even), multiplied by the int8 weight rows
// with oneDNN's integer GEMM (int8_prepack.h: the matmul primitive on the weight's prepacked
// blob when the caller passes one, else dnnl_gemm_u8s8s32; the same int32 sums), then the fp32
// epilogue
//   y_ij = (scale_i * w_scale_j) * (C_ij - zp_i * colsum_j) + bias_j
// (the same expression, compiled without FMA contraction: the same float32 values as
// int8_linear for the same codes). The layer's algebra is the MLX path's for a W8A8 layer:
//   q = query(x) * q_scale, k = key(x), v = value(x),
//   h = LN1(x + out(Attn(q, k, v))),  y = LN2(h + output(act(intermediate(h)))),
// the attention, softmax, activation and layer norms being fused_common.h's loops.
//
// What the one op saves against six int8_linear calls and the MLX ops between them: q, k and v
// share one quantization of x and one GEMM on their weights stacked (3D, D) at build time (when
// their SmoothQuant factors are equal or absent; else three quantizations, three GEMMs), the
// int32 product is written in place of its float32 result (same size) and the epilogue (with
// q's scale, the activation) runs on it row by row, and no MLX op runs in between.
// `threads` >= 2: each phase split in two parts (heads, output columns, rows) over
// fused_common.h's helper thread (the GEMMs then run on column slices of the weights:
// dnnl_gemm_u8s8s32, the blobs cover whole weights only); each part quantizes the whole input
// of its GEMM (a few microseconds at the few rows where two parts run) so the phases stay six.
// Scratch (activations, codes, row scales) comes from MLX's allocator (counts in
// mx.get_peak_memory()).

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

#include "fused_common.h"  // row loops, attention, the helper thread
#include "fused_int8.h"    // the quantizer, the epilogue's value, the integer GEMM

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

namespace {

constexpr int kGemms = 4;  // q|k|v stacked, out, intermediate, output

struct I8Args {
  const float *x, *kb, *g1, *be1, *g2, *be2;
  I8Proj pr[kGemms];
  const float* smooth[6];  // query, key, value, out, intermediate, output: 1/s or null
  bool qkv_shared;         // one quantization of x for q, k and v (smooth[0] for all three)
  float *y, *qkv, *ctx, *h, *inter, *scores;
  float *rs, *tmp;  // per part: rows scales, one smoothed row (max(D, F))
  int32_t* zp;      // per part: rows zero points
  uint8_t* codes;   // per part: rows x max(D, F) codes
  const int* lens;
  int n_seqs, rows, d, f, heads, act, lmax, wmax;
  bool avx2, qkv_only;
  float eps1, eps2, q_scale;
};

// every row of x (rows, k) of part p into its codes, scales and zero points
FL_INLINE void quantize_part(const I8Args& a, const float* x, int k, const float* sm, int p) {
  quantize_rows8(x, k, a.rows, k, sm, a.tmp + int64_t(p) * a.wmax,
                 a.codes + int64_t(p) * a.rows * a.wmax, a.rs + int64_t(p) * a.rows,
                 a.zp + int64_t(p) * a.rows);
}

// columns [c0, c1) of c (rows, ldc), as int32: part p's codes times rows [w0 + c0, w0 + c1)
// of projection g's weight (k inputs)
FL_INLINE void gemm_cols(const I8Args& a, int g, int k, int w0, int c0, int c1, float* c,
                         int ldc, int p) {
  if (c1 <= c0 || a.rows == 0) return;
  const bool whole = w0 == 0 && c0 == 0 && c1 == a.pr[g].n;  // the blob covers whole weights
  int8_gemm_rows(a.rows, c1 - c0, k, a.codes + int64_t(p) * a.rows * a.wmax,
                 a.pr[g].w + int64_t(w0 + c0) * k, c + c0, ldc,
                 whole ? a.pr[g].packed : nullptr);
}

// the fp32 epilogue of one row, in place over columns [c0, c1); POST: -1 none, 0 erf GELU,
// 1 ReLU, 2 times q's scale (a template: GCC 12 vectorizes the loop only without the branches)
template <int POST>
FL_INLINE void epilogue_row(const i32a* src, float* dst, int c0, int c1, float si, int32_t zi,
                            const float* ws, const int32_t* cs, const float* b, float q_scale) {
#pragma omp simd
  for (int j = c0; j < c1; ++j) {
    float v = int8_value(src[j], si, zi, ws[j], cs[j]);
    v = v + b[j];
    if (POST == 2) v = v * q_scale;
    if (POST == 0) v = gelu_erf(v);
    if (POST == 1) v = v > 0.0f ? v : 0.0f;
    dst[j] = v;
  }
}

// the fp32 epilogue in place over those columns of every row; post as epilogue_row's
FL_INLINE void epilogue(const I8Args& a, int g, int w0, int c0, int c1, float* c, int ldc, int p,
                        int post) {
  const I8Proj& pr = a.pr[g];
  const float* rs = a.rs + int64_t(p) * a.rows;
  const int32_t* zp = a.zp + int64_t(p) * a.rows;
  const float *ws = pr.ws + w0, *b = pr.bias + w0;
  const int32_t* cs = pr.colsum + w0;
  for (int i = 0; i < a.rows; ++i) {
    float* dst = c + int64_t(i) * ldc;
    const i32a* src = reinterpret_cast<const i32a*>(dst);
    if (post == 0)
      epilogue_row<0>(src, dst, c0, c1, rs[i], zp[i], ws, cs, b, a.q_scale);
    else if (post == 1)
      epilogue_row<1>(src, dst, c0, c1, rs[i], zp[i], ws, cs, b, a.q_scale);
    else if (post == 2)
      epilogue_row<2>(src, dst, c0, c1, rs[i], zp[i], ws, cs, b, a.q_scale);
    else
      epilogue_row<-1>(src, dst, c0, c1, rs[i], zp[i], ws, cs, b, a.q_scale);
  }
}

FL_INLINE void int8_gemm_cols(const I8Args& a, int g, int k, int w0, int c0, int c1, float* c,
                              int ldc, int p, int post) {
  if (c1 <= c0 || a.rows == 0) return;
  gemm_cols(a, g, k, w0, c0, c1, c, ldc, p);
  epilogue(a, g, w0, c0, c1, c, ldc, p, post);
}

FL_INLINE void phase(const I8Args& a, int k, int p, int n) {
  const int N = a.rows, D = a.d, F = a.f, hd = D / a.heads, D3 = 3 * D;
  int lo, hi;
  if (k == 0) {  // q|k|v for this part's heads, then their attention
    int h0, h1;
    cut(a.heads, 1, p, n, h0, h1);
    lo = h0 * hd, hi = h1 * hd;
    if (a.qkv_shared) {
      quantize_part(a, a.x, D, a.smooth[0], p);
      if (lo == 0 && hi == D) {  // all heads: one GEMM on the stacked weight, then epilogues
        gemm_cols(a, 0, D, 0, 0, D3, a.qkv, D3, p);
        epilogue(a, 0, 0, 0, D, a.qkv, D3, p, 2);
        epilogue(a, 0, 0, D, D3, a.qkv, D3, p, -1);
      } else {
        for (int j = 0; j < 3; ++j)
          int8_gemm_cols(a, 0, D, j * D, lo, hi, a.qkv + j * D, D3, p, j == 0 ? 2 : -1);
      }
    } else {
      for (int j = 0; j < 3; ++j) {
        quantize_part(a, a.x, D, a.smooth[j], p);
        int8_gemm_cols(a, 0, D, j * D, lo, hi, a.qkv + j * D, D3, p, j == 0 ? 2 : -1);
      }
    }
    if (!a.qkv_only)
      attend_heads(a.qkv, a.ctx, a.scores + int64_t(p) * a.lmax * a.lmax, a.lens, a.n_seqs, a.kb,
                   D, hd, h0, h1, a.lmax);
  } else if (k == 1) {  // h = out(ctx), this part's columns
    quantize_part(a, a.ctx, D, a.smooth[3], p);
    cut(D, 16, p, n, lo, hi);
    int8_gemm_cols(a, 1, D, 0, lo, hi, a.h, D, p, -1);
  } else if (k == 2) {  // h = LN1(x + h), this part's rows
    cut(N, 1, p, n, lo, hi);
    for (int64_t i = lo; i < hi; ++i)
      add_layer_norm_row(a.x + i * D, a.h + i * D, a.g1, a.be1, a.eps1, a.h + i * D, D);
  } else if (k == 3) {  // inter = act(intermediate(h)), this part's columns
    quantize_part(a, a.h, D, a.smooth[4], p);
    cut(F, 16, p, n, lo, hi);
    int8_gemm_cols(a, 2, D, 0, lo, hi, a.inter, F, p, a.act);
  } else if (k == 4) {  // y = output(inter), this part's columns
    quantize_part(a, a.inter, F, a.smooth[5], p);
    cut(D, 16, p, n, lo, hi);
    int8_gemm_cols(a, 3, F, 0, lo, hi, a.y, D, p, -1);
  } else {  // y = LN2(h + y), this part's rows
    cut(N, 1, p, n, lo, hi);
    for (int64_t i = lo; i < hi; ++i)
      add_layer_norm_row(a.h + i * D, a.y + i * D, a.g2, a.be2, a.eps2, a.y + i * D, D);
  }
}

constexpr int kPhases = 6;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define I8_HAVE_AVX2 1
__attribute__((target("avx2,fma"))) void phase_avx2(const I8Args& a, int k, int p, int n) {
  phase(a, k, p, n);
}
#endif

void phase_portable(const I8Args& a, int k, int p, int n) { phase(a, k, p, n); }

void run_phase(const void* v, int k, int p, int n) {
  const I8Args& a = *static_cast<const I8Args*>(v);
#ifdef I8_HAVE_AVX2
  if (a.avx2) return phase_avx2(a, k, p, n);
#endif
  phase_portable(a, k, p, n);
}

}  // namespace

class FusedBertInt8LayerCpu : public UnaryPrimitive {
 public:
  FusedBertInt8LayerCpu(Stream s, std::vector<int> lens, bool has_kb, std::vector<bool> has_sm,
                        std::vector<bool> has_pk, bool qkv_shared, int heads, float q_scale,
                        float eps1, float eps2, int act, int threads, bool qkv_only)
      : UnaryPrimitive(s), lens_(std::move(lens)), has_kb_(has_kb), has_sm_(std::move(has_sm)),
        has_pk_(std::move(has_pk)), qkv_shared_(qkv_shared), heads_(heads), q_scale_(q_scale), eps1_(eps1), eps2_(eps2),
        act_(act), threads_(threads), qkv_only_(qkv_only) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::vector<array> ins;
    for (auto& a : inputs) ins.push_back(array::unsafe_weak_copy(a));
    enc.dispatch([ins = std::move(ins), o = array::unsafe_weak_copy(out), lens = lens_,
                  has_kb = has_kb_, has_sm = has_sm_, has_pk = has_pk_, shared = qkv_shared_, heads = heads_,
                  q_scale = q_scale_, eps1 = eps1_, eps2 = eps2_, act = act_,
                  threads = threads_, qkv_only = qkv_only_]() mutable {
      const int N = ins[0].shape(0), D = ins[0].shape(1);
      int i = has_kb ? 2 : 1;
      auto f = [&](int j) { return ins[j].data<float>(); };
      I8Args a{};
      a.x = f(0);
      a.kb = has_kb ? f(1) : nullptr;
      for (int g = 0; g < kGemms; ++g, i += 4)
        a.pr[g] = I8Proj{ins[i].data<int8_t>(), f(i + 1), f(i + 3), ins[i + 2].data<int32_t>(),
                         nullptr, int(ins[i].shape(0))};
      const int F = ins[i - 8].shape(0);  // the intermediate weight (F, D)
      a.g1 = f(i), a.be1 = f(i + 1), a.g2 = f(i + 2), a.be2 = f(i + 3);
      i += 4;
      for (int j = 0; j < 6; ++j) a.smooth[j] = has_sm[j] ? f(i++) : nullptr;
      for (int g = 0; g < kGemms; ++g)
        if (has_pk[g]) a.pr[g].packed = ins[i++].data<uint8_t>();
      if (shared) a.smooth[1] = a.smooth[2] = a.smooth[0];
      a.qkv_shared = shared;
      const int Lmax = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
      const int parts = threads >= 2 ? 2 : 1;
      a.rows = N, a.d = D, a.f = F, a.heads = heads, a.act = act, a.lmax = Lmax;
      a.wmax = std::max(D, F);
      a.lens = lens.data(), a.n_seqs = int(lens.size());
      a.avx2 = fused_use_avx2(), a.qkv_only = qkv_only;
      a.eps1 = eps1, a.eps2 = eps2, a.q_scale = q_scale;
      // floats: q|k|v, ctx, h, inter, scores (fused_layer.h's layout), then per part the row
      // scales and a smoothed row; then per part the zero points (int32) and the codes (uint8)
      const size_t acts = fused_act_floats(N, D, F, Lmax, parts);
      const size_t extra = size_t(parts) * (size_t(N) + a.wmax);
      const size_t bytes = (acts + extra) * 4 + size_t(parts) * N * 4 +
                           size_t(parts) * N * a.wmax + 64;
      auto buf = allocator::allocator().malloc(bytes);
      float* w = static_cast<float*>(buf.raw_ptr());
      a.qkv = w;
      a.ctx = w + size_t(N) * 3 * D;
      a.h = w + size_t(N) * 4 * D;
      a.inter = w + size_t(N) * 5 * D;
      a.scores = w + size_t(N) * (5 * size_t(D) + F);
      a.rs = w + acts;
      a.tmp = a.rs + size_t(parts) * N;
      a.zp = reinterpret_cast<int32_t*>(w + acts + extra);
      a.codes = reinterpret_cast<uint8_t*>(a.zp + size_t(parts) * N);
      a.y = o.data<float>();
      if (qkv_only) a.qkv = a.y;  // (N, 3D): the projections before the attention
      run_parts(run_phase, &a, qkv_only ? 1 : kPhases, parts);
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("FusedBertInt8LayerCpu has no GPU implementation");
  }
  DEFINE_NAME(FusedBertInt8LayerCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FusedBertInt8LayerCpu&>(other);
    return lens_ == o.lens_ && has_kb_ == o.has_kb_ && has_sm_ == o.has_sm_ &&
           has_pk_ == o.has_pk_ &&
           qkv_shared_ == o.qkv_shared_ && heads_ == o.heads_ && q_scale_ == o.q_scale_ &&
           eps1_ == o.eps1_ && eps2_ == o.eps2_ && act_ == o.act_ && threads_ == o.threads_ &&
           qkv_only_ == o.qkv_only_;
  }

 private:
  std::vector<int> lens_;
  bool has_kb_;
  std::vector<bool> has_sm_, has_pk_;
  bool qkv_shared_;
  int heads_;
  float q_scale_, eps1_, eps2_;
  int act_, threads_;
  bool qkv_only_;
};

namespace {

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("fused_int8layer: ") + what);
}

array contig(const array& a, const Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, s);
}

bool vec(const array& a, Dtype dt, int n) {
  return a.dtype() == dt && a.ndim() == 1 && a.shape(0) == n;
}

}  // namespace

array fused_bert_int8layer_cpu(const array& x, const std::vector<int>& lens,
                               const std::optional<array>& key_bias,
                               const std::vector<array>& proj,
                               const std::vector<std::optional<array>>& smooth, bool qkv_shared,
                               const std::vector<array>& norms, int heads, float q_scale,
                               float eps1, float eps2, int act, int threads, bool qkv_only,
                               const std::vector<std::optional<array>>& packed) {
  if (!int8_has_dnnl()) throw std::runtime_error("fused_int8layer: built without oneDNN");
  auto s = to_stream({});
  need(s.device == Device::cpu, "CPU stream only");
  need(x.dtype() == float32 && x.ndim() == 2, "x must be float32 (rows, D)");
  need(proj.size() == 4 * kGemms,
       "proj: (wq int8, w_scale, colsum int32, bias) of q|k|v stacked, out, intermediate, output");
  need(smooth.size() == 6, "smooth: 6 entries (query, key, value, out, intermediate, output)");
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
  const int F = proj[8].ndim() == 2 ? proj[8].shape(0) : -1;
  need(F > 0, "intermediate weight (F, D)");
  const int outs[kGemms] = {3 * D, D, F, D}, ins_[kGemms] = {D, D, D, F};
  for (int g = 0; g < kGemms; ++g) {
    const array& w = proj[4 * g];
    need(w.dtype() == int8 && w.ndim() == 2 && w.shape(0) == outs[g] && w.shape(1) == ins_[g],
         "weights int8: q|k|v (3D, D), out (D, D), intermediate (F, D), output (D, F)");
    for (int j = 1; j < 4; ++j)
      need(vec(proj[4 * g + j], j == 2 ? int32 : float32, outs[g]),
           "each w_scale float32 (out,), colsum int32 (out,), bias float32 (out,)");
  }
  for (auto& g : norms) need(vec(g, float32, D), "norms float32 (D,)");
  const int sm_in[6] = {D, D, D, D, D, F};
  std::vector<bool> has_sm(6);
  for (int j = 0; j < 6; ++j) {
    has_sm[j] = smooth[j].has_value() && !(qkv_shared && (j == 1 || j == 2));
    if (has_sm[j]) need(vec(*smooth[j], float32, sm_in[j]), "each inv_smooth float32 (in,)");
  }
  std::vector<array> in = {contig(x, s)};
  if (key_bias) {
    need(key_bias->dtype() == float32 && key_bias->size() == size_t(N), "key_bias (rows,)");
    in.push_back(contig(reshape(*key_bias, {N}, s), s));
  }
  for (auto& a : proj) in.push_back(contig(a, s));
  for (auto& a : norms) in.push_back(contig(a, s));
  for (int j = 0; j < 6; ++j)
    if (has_sm[j]) in.push_back(contig(*smooth[j], s));
  need(packed.empty() || packed.size() == kGemms,
       "packed: none or 4 entries (int8_prepack of q|k|v stacked, out, intermediate, output)");
  std::vector<bool> has_pk(kGemms, false);
  for (size_t g = 0; g < packed.size(); ++g) {
    if (!packed[g]) continue;
    const array& p = *packed[g];
    need(p.dtype() == uint8 && p.ndim() == 1 &&
             p.shape(0) == int8_prepack_bytes(outs[g], ins_[g]),
         "each packed entry int8_prepack(wq) of its weight (uint8) or None");
    has_pk[g] = true;
    in.push_back(contig(p, s));
  }
  const int cols = qkv_only ? 3 * D : D;
  return array({N, cols}, float32,
               std::make_shared<FusedBertInt8LayerCpu>(s, lens, bool(key_bias), has_sm, has_pk,
                                                       qkv_shared, heads, q_scale, eps1, eps2,
                                                       act, threads, qkv_only),
               in);
}

void register_fused_int8_layer(nb::module_& m) {
  m.def("fused_bert_int8layer", &fused_bert_int8layer_cpu, "x"_a, "lens"_a,
        "key_bias"_a = nb::none(), "proj"_a, "smooth"_a, "qkv_shared"_a, "norms"_a, "heads"_a,
        "q_scale"_a, "eps1"_a, "eps2"_a, "act"_a = 0, "threads"_a = 0, "qkv_only"_a = false,
        "packed"_a = std::vector<std::optional<array>>{},
        "One post-norm BERT layer on rows x (N, D) float32 with W8A8 projections on oneDNN's "
        "integer GEMM (see fused_int8_layer.cpp; packed: [] or int8_prepack's blobs of the 4 "
        "weights, entries may be None); qkv_only: return the (N, 3D) projections "
        "q * q_scale | k | v instead; CPU stream. -> (N, D).");
}

}  // namespace mlx::core
