// CPU kernels for MLX affine-quantized Linears (mlx-variants, variants/qkernel).
//
// Two MLX primitives (CPU eval only; the Python side uses them only when MLX's default device
// is the CPU):
//   QDequantCpu  (w, scales, biases)            -> W (out, in) float32, equal to mx.dequantize
//   QLinearCpu   (x, w, scales, biases[, bias]) -> x @ W.T (+ bias), W dequantized tile by tile
//                (`tile` output rows at a time) into a small buffer, each tile fed to
//                cblas_sgemm; tile >= out: the whole W into one temporary buffer, one sgemm.
// The packed layout is mx.quantize's (affine): each row a little-endian bit stream, value i at
// bits [i*bits, (i+1)*bits); per group of `group_size` values: w = scale * q + bias (float32,
// multiply then add, as MLX's CPU dequantize computes it: built with -ffp-contract=off).
// Scales and biases are float32, float16 or bfloat16 (both the same dtype): half-precision ones
// are widened to float32 exactly (one pass over a call's rows, before the loops), so
// w = float32(scale) * q + float32(bias) in float32, which is what mx.quantized_matmul computes
// with float32 x and what mx.dequantize computes with float32 scales (mx.dequantize with
// half-precision scales returns the weight rounded to that half-precision dtype instead).
// Temporary buffers come from MLX's allocator, so they count in mx.get_peak_memory().
// Vectorisation: an AVX2 loop (intrinsics in a target("avx2") function, taken only when the CPU
// reports AVX2 at run time) and a portable loop for other CPUs; no -march=native.

#include <algorithm>
#include <atomic>
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

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "fused_layer.h"
#include "scale_widen.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QK_HAVE_AVX2_PATH 1
#endif

// false: the portable loops even where AVX2 is there (tests compare both paths)
std::atomic<bool> g_allow_avx2{true};

bool cpu_has_avx2() {
#ifdef QK_HAVE_AVX2_PATH
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return avx2;
#else
  return false;
#endif
}

bool use_avx2() { return g_allow_avx2.load(std::memory_order_relaxed) && cpu_has_avx2(); }

// rows [r0, r1) of W into dst (row stride in), scales / biases: row r0's first (float32, one
// per group, row-major): the portable loop (the compiler vectorises what it can at the
// baseline ISA)
template <int BITS>
void dequant_rows(const uint8_t* w, const float* scales, const float* biases, float* dst,
                  int64_t r0, int64_t r1, int64_t in, int group_size) {
  constexpr int NB = (BITS == 3 || BITS == 6) ? 3 : 4;  // bytes per chunk
  constexpr int NV = NB * 8 / BITS;                      // values per chunk
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int64_t row_bytes = in * BITS / 8;
  const int64_t groups = in / group_size;
  const int chunks = group_size / NV;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = w + r * row_bytes;
    float* o = dst + (r - r0) * in;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scales[(r - r0) * groups + g], b = biases[(r - r0) * groups + g];
      for (int c = 0; c < chunks; ++c) {
        uint32_t u;
        if constexpr (NB == 4) {
          std::memcpy(&u, p, 4);
        } else {
          u = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16);
        }
        p += NB;
        for (int k = 0; k < NV; ++k) {
          o[k] = float((u >> (k * BITS)) & MASK) * s + b;
        }
        o += NV;
      }
    }
  }
}

#ifdef QK_HAVE_AVX2_PATH
// The AVX2 loop: 8 values take exactly BITS bytes; one 8-byte load, a byte shuffle puts the two
// bytes holding value i into 32-bit lane i, a per-lane shift and mask give q, then
// (float) q * scale + bias (multiply, then add: no FMA). ~0.1-0.3 ns per weight here against
// ~0.35-0.45 for the portable loop. w_end: the end of the packed buffer (no read past it).
template <int BITS>
__attribute__((target("avx2"))) void dequant_rows_avx2(
    const uint8_t* w, const uint8_t* w_end, const float* scales, const float* biases,
    float* dst, int64_t r0, int64_t r1, int64_t in, int group_size) {
  alignas(32) int8_t shuf[32];
  alignas(32) int32_t shifts[8];
  for (int i = 0; i < 8; ++i) {
    const int b0 = i * BITS / 8;
    for (int j = 0; j < 4; ++j) {
      const int idx = b0 + j;  // both 128-bit halves hold the same 8 bytes
      shuf[i * 4 + j] = (j < 2 && idx < BITS) ? int8_t(idx) : int8_t(-128);  // -128: zero
    }
    shifts[i] = (i * BITS) % 8;
  }
  const __m256i SHUF = _mm256_load_si256(reinterpret_cast<const __m256i*>(shuf));
  const __m256i SH = _mm256_load_si256(reinterpret_cast<const __m256i*>(shifts));
  const __m256i MASK = _mm256_set1_epi32((1 << BITS) - 1);
  const int64_t row_bytes = in * BITS / 8, groups = in / group_size;
  const int blocks = group_size / 8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = w + r * row_bytes;
    float* o = dst + (r - r0) * in;
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 S = _mm256_set1_ps(scales[(r - r0) * groups + g]);
      const __m256 B = _mm256_set1_ps(biases[(r - r0) * groups + g]);
      for (int c = 0; c < blocks; ++c) {
        uint64_t u = 0;
        if (p + 8 <= w_end) {
          std::memcpy(&u, p, 8);
        } else {
          std::memcpy(&u, p, BITS);
        }
        p += BITS;
        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x(static_cast<long long>(u)), SHUF);
        v = _mm256_and_si256(_mm256_srlv_epi32(v, SH), MASK);
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(v), S), B));
        o += 8;
      }
    }
  }
}
#endif

template <int BITS>
void dequant_bits(const uint8_t* w, const uint8_t* w_end, const float* s, const float* b,
                  float* dst, int64_t r0, int64_t r1, int64_t in, int gs, bool avx2) {
#ifdef QK_HAVE_AVX2_PATH
  if (avx2) return dequant_rows_avx2<BITS>(w, w_end, s, b, dst, r0, r1, in, gs);
#endif
  dequant_rows<BITS>(w, s, b, dst, r0, r1, in, gs);
}

}  // namespace

// Half-precision scales and biases (QProj::stype kScaleF16 / kScaleBF16) are widened to float32,
// exactly, for the rows one call dequantizes, in passes of kWidenRows rows (scale_widen.h)
// before dequant_bits, whose loops then are the float32 ones. (Widening each group's scale and
// bias inside the group loop measured 0.72-0.86x the float32 speed on MiniLM's 384-value rows:
// the group loops are that short.)

// rows per widening pass (their widened scales and biases stay in L1: 64 rows
// of 384 values at group size 32 are 6 KiB)
constexpr int64_t kWidenRows = 64;

void qk_dequant(const QProj& q, float* dst, int64_t r0, int64_t r1) {
  const int64_t in = q.in, groups = q.in / q.group_size;
  const int gs = q.group_size;
  const bool avx2 = use_avx2();
  auto run = [&](const float* s, const float* b, float* out, int64_t a, int64_t z) {
    switch (q.bits) {
      case 2: return dequant_bits<2>(q.w, q.w_end, s, b, out, a, z, in, gs, avx2);
      case 3: return dequant_bits<3>(q.w, q.w_end, s, b, out, a, z, in, gs, avx2);
      case 4: return dequant_bits<4>(q.w, q.w_end, s, b, out, a, z, in, gs, avx2);
      case 6: return dequant_bits<6>(q.w, q.w_end, s, b, out, a, z, in, gs, avx2);
      case 8: return dequant_bits<8>(q.w, q.w_end, s, b, out, a, z, in, gs, avx2);
      default: throw std::invalid_argument("qkernel: bits must be 2, 3, 4, 6 or 8");
    }
  };
  if (q.stype == kScaleF32)
    return run(static_cast<const float*>(q.scales) + r0 * groups,
               static_cast<const float*>(q.biases) + r0 * groups, dst, r0, r1);
  if (q.stype != kScaleF16 && q.stype != kScaleBF16)
    throw std::invalid_argument("qkernel: scales must be float32, float16 or bfloat16");
  const bool bf16 = q.stype == kScaleBF16;
  // the widened copies of kWidenRows rows: one small buffer per thread, kept (not from MLX's
  // allocator: the fused layers call this from their helper thread too)
  thread_local std::vector<float> widened;
  const size_t need = 2 * size_t(kWidenRows * groups);
  if (widened.size() < need) widened.resize(need);
  float* buf = widened.data();
  auto widen = [&](const void* src, float* to, int64_t a, int64_t count) {
    const uint16_t* h = static_cast<const uint16_t*>(src) + a * groups;
#ifdef QK_HAVE_AVX2_PATH
    if (avx2) return widen_avx2(h, to, count, bf16);
#endif
    widen_portable(h, to, count, bf16);
  };
  for (int64_t a = r0; a < r1; a += kWidenRows) {
    const int64_t z = std::min(r1, a + kWidenRows), n = (z - a) * groups;
    widen(q.scales, buf, a, n);
    widen(q.biases, buf + n, a, n);
    run(buf, buf + n, dst + (a - r0) * in, a, z);
  }
}

int qk_scale_type(const array& scales) {
  if (scales.dtype() == float16) return kScaleF16;
  if (scales.dtype() == bfloat16) return kScaleBF16;
  return kScaleF32;
}

bool qk_use_avx2() { return use_avx2(); }

QProj qk_proj(const array& w, const array& scales, const array& biases, int group_size,
              int bits) {
  const uint8_t* p = w.data<uint8_t>();
  return QProj{p, p + w.nbytes(), scales.data<void>(), biases.data<void>(),
               int64_t(scales.shape(1)) * group_size, group_size, bits, qk_scale_type(scales)};
}

namespace {

void check_args(const array& w, const array& scales, const array& biases, int group_size,
                int bits) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 6 && bits != 8)
    throw std::invalid_argument("qkernel: bits must be 2, 3, 4, 6 or 8");
  if (w.dtype() != uint32 ||
      (scales.dtype() != float32 && scales.dtype() != float16 && scales.dtype() != bfloat16) ||
      biases.dtype() != scales.dtype())
    throw std::invalid_argument("qkernel: w must be uint32, scales and biases float32, float16 "
                                "or bfloat16 (both the same dtype)");
  if (w.ndim() != 2 || scales.ndim() != 2 || biases.shape() != scales.shape() ||
      scales.shape(0) != w.shape(0))
    throw std::invalid_argument("qkernel: w (out, packed), scales/biases (out, groups)");
  int nv = (bits == 3 || bits == 6) ? 24 / bits : 32 / bits;
  int64_t in = int64_t(w.shape(1)) * 32 / bits;
  if (group_size % nv != 0 || group_size % 8 != 0 || in != int64_t(scales.shape(1)) * group_size)
    throw std::invalid_argument("qkernel: group_size does not match w and scales");
}

}  // namespace

void qk_check_args(const array& w, const array& scales, const array& biases, int group_size,
                   int bits) {
  check_args(w, scales, biases, group_size, bits);
}

class QDequantCpu : public UnaryPrimitive {
 public:
  QDequantCpu(Stream s, int group_size, int bits)
      : UnaryPrimitive(s), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    enc.dispatch([w = array::unsafe_weak_copy(inputs[0]),
                  s = array::unsafe_weak_copy(inputs[1]),
                  b = array::unsafe_weak_copy(inputs[2]),
                  o = array::unsafe_weak_copy(out), gs = group_size_, bits = bits_]() mutable {
      qk_dequant(qk_proj(w, s, b, gs, bits), o.data<float>(), 0, o.shape(0));
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("QDequantCpu has no GPU implementation");
  }
  DEFINE_NAME(QDequantCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const QDequantCpu&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }

 private:
  int group_size_, bits_;
};

class QLinearCpu : public UnaryPrimitive {
 public:
  QLinearCpu(Stream s, int group_size, int bits, int tile)
      : UnaryPrimitive(s), group_size_(group_size), bits_(bits), tile_(tile) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    bool has_bias = inputs.size() == 5;
    enc.dispatch([x = array::unsafe_weak_copy(inputs[0]),
                  w = array::unsafe_weak_copy(inputs[1]),
                  s = array::unsafe_weak_copy(inputs[2]),
                  b = array::unsafe_weak_copy(inputs[3]),
                  bias = array::unsafe_weak_copy(inputs[has_bias ? 4 : 0]), has_bias,
                  o = array::unsafe_weak_copy(out), gs = group_size_, bits = bits_,
                  tile = tile_]() mutable {
      const int64_t m = x.shape(0), k = x.shape(1), n = o.shape(1);
      float* y = o.data<float>();
      if (has_bias) {
        const float* bp = bias.data<float>();
        for (int64_t i = 0; i < m; ++i) std::memcpy(y + i * n, bp, n * sizeof(float));
      }
      const int64_t t = (tile <= 0 || tile >= n) ? n : tile;
      auto buf = allocator::allocator().malloc(size_t(t * k) * sizeof(float));
      float* wt = static_cast<float*>(buf.raw_ptr());
      const QProj q = qk_proj(w, s, b, gs, bits);
      for (int64_t r0 = 0; r0 < n; r0 += t) {
        const int64_t r1 = std::min(n, r0 + t);
        qk_dequant(q, wt, r0, r1);
        cblas_sgemm(kRowMajor, kNoTrans, kTrans, int(m), int(r1 - r0), int(k), 1.0f,
                    x.data<float>(), int(k), wt, int(k), has_bias ? 1.0f : 0.0f, y + r0,
                    int(n));
      }
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("QLinearCpu has no GPU implementation");
  }
  DEFINE_NAME(QLinearCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const QLinearCpu&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && tile_ == o.tile_;
  }

 private:
  int group_size_, bits_, tile_;
};

// `a` itself when it is evaluated and row-contiguous (model parameters: no extra graph node),
// else a row-contiguous version of it
array packed(const array& a, const Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, s);
}

array dequantize_cpu(const array& w, const array& scales, const array& biases, int group_size,
                     int bits) {
  check_args(w, scales, biases, group_size, bits);
  auto s = to_stream({});
  if (s.device != Device::cpu) throw std::invalid_argument("qkernel: CPU stream only");
  std::vector<array> in = {packed(w, s), packed(scales, s), packed(biases, s)};
  Shape shape = {w.shape(0), scales.shape(1) * group_size};
  return array(shape, float32, std::make_shared<QDequantCpu>(s, group_size, bits), in);
}

array qlinear_cpu(const array& x, const array& w, const array& scales, const array& biases,
                  const std::optional<array>& bias, int group_size, int bits, int tile) {
  check_args(w, scales, biases, group_size, bits);
  auto s = to_stream({});
  if (s.device != Device::cpu) throw std::invalid_argument("qkernel: CPU stream only");
  const int n = w.shape(0), k = scales.shape(1) * group_size;
  if (x.dtype() != float32 || x.ndim() < 1 || x.shape(-1) != k)
    throw std::invalid_argument("qkernel: x must be float32 (..., in)");
  if (bias && (bias->dtype() != float32 || bias->ndim() != 1 || bias->shape(0) != n))
    throw std::invalid_argument("qkernel: bias must be float32 (out,)");
  const int m = x.size() / k;
  std::vector<array> in = {contiguous(reshape(x, {m, k}, s), false, s), packed(w, s),
                           packed(scales, s), packed(biases, s)};
  if (bias) in.push_back(packed(*bias, s));
  auto y = array({m, n}, float32, std::make_shared<QLinearCpu>(s, group_size, bits, tile), in);
  Shape shape = x.shape();
  shape.back() = n;
  return reshape(y, shape, s);
}

void register_fused_layer(nb::module_& m);  // fused_layer.cpp
void register_fused_qlayer(nb::module_& m);  // fused_qlayer.cpp
void register_fused_mbert_layer(nb::module_& m);  // fused_mbert_layer.cpp
void register_fused_mbert_qlayer(nb::module_& m);  // fused_mbert_qlayer.cpp
void register_int8_linear(nb::module_& m);  // int8_linear.cpp
void register_qmodes(nb::module_& m);  // qmodes.cpp
void register_fused_int8_layer(nb::module_& m);  // fused_int8_layer.cpp
void register_fused_mbert_int8layer(nb::module_& m);  // fused_mbert_int8layer.cpp

}  // namespace mlx::core

NB_MODULE(_qkernel, m) {
  m.doc() = "mlx-variants CPU kernels for affine-quantized Linears (see qkernel.cpp)";
  m.def("dequantize", &mlx::core::dequantize_cpu, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a,
        "W (out, in) float32 from mx.quantize's packed (w, scales, biases); CPU stream.");
  m.def("qlinear", &mlx::core::qlinear_cpu, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "bias"_a = nb::none(), "group_size"_a, "bits"_a, "tile"_a,
        "x @ W.T (+ bias): W dequantized `tile` output rows at a time into a buffer, each "
        "tile multiplied by cblas_sgemm (tile <= 0 or >= out: the whole W, one sgemm).");
  m.def("has_avx2", &mlx::core::cpu_has_avx2, "Whether the AVX2 unpacking loop can run here.");
  m.def("allow_avx2", [](bool on) { return mlx::core::g_allow_avx2.exchange(on); }, "on"_a,
        "Allow (True, the default) or forbid the AVX2 loop; returns the previous setting.");
  mlx::core::register_fused_layer(m);
  mlx::core::register_fused_qlayer(m);
  mlx::core::register_fused_mbert_layer(m);
  mlx::core::register_fused_mbert_qlayer(m);
  mlx::core::register_int8_linear(m);
  mlx::core::register_qmodes(m);
  mlx::core::register_fused_int8_layer(m);
  mlx::core::register_fused_mbert_int8layer(m);
}
