// The compiled CPU dequantizer for MLX's microscaling modes (mlx-variants, variants/qkernel):
//   QDequantModeCpu (w, scales) -> W (out, in) float32, equal to
//   mx.dequantize(w, scales, mode=mode, dtype=mx.float32) (tests/runtime/test_qmodes.py)
// for mode "mxfp4" (group 32, 4 bits, FP4 E2M1 values, E8M0 scales: 2^(s - 127)), "mxfp8"
// (group 32, 8 bits, FP8 E4M3 values, E8M0 scales) and "nvfp4" (group 16, 4 bits, E2M1 values,
// FP8 E4M3 scales; no global scale). w packs each row little-endian from the low bits, as
// mx.quantize does (8 nibbles or 4 bytes per uint32); scales are uint8 codes, one per group.
// Every value is code value * scale, one float32 multiply; exact (both factors have at most 4
// significant bits and the product stays above float32's smallest subnormal), so any correct
// order of evaluation gives MLX's numbers. MLX's own CPU kernel takes ~8 ns per weight here
// (5 ms for a 384 x 1536 weight); this loop ~0.2-0.5 ns (bench/scale_dtype_speed.py).

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

bool qk_use_avx2();  // qkernel.cpp: the AVX2 loops allowed and supported

namespace {

enum Mode : int { kMxfp4 = 0, kMxfp8 = 1, kNvfp4 = 2 };

// FP8 E4M3 (OCP "fn": no infinities, S.1111.111 NaN) -> float32, exact
float e4m3_value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  float v;
  if (e == 15 && m == 7) {
    v = std::nanf("");
  } else if (e == 0) {
    v = std::ldexp(float(m), -9);  // subnormal: m / 8 * 2^-6
  } else {
    v = std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  }
  return (c & 0x80) ? -v : v;
}

// E8M0 -> float32: 2^(c - 127) (2^-127 is a float32 subnormal, exact); 0xFF (NaN in OCP's
// format) gives 2^128 = inf, as MLX's CPU kernel does
float e8m0_value(uint8_t c) { return std::ldexp(1.0f, int(c) - 127); }

// FP4 E2M1 -> float32
constexpr float kFp4[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

struct Tables {
  float e4m3[256], e8m0[256];
  Tables() {
    for (int c = 0; c < 256; ++c) e4m3[c] = e4m3_value(uint8_t(c)), e8m0[c] = e8m0_value(uint8_t(c));
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// rows [0, out) into dst, portable: a table lookup and a multiply per value
void dequant_portable(const uint8_t* w, const uint8_t* sc, float* dst, int64_t out, int64_t in,
                      int gs, int mode) {
  const Tables& t = tables();
  const float* scale_of = mode == kNvfp4 ? t.e4m3 : t.e8m0;
  const int64_t groups = in / gs;
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scale_of[sc[r * groups + g]];
      float* o = dst + r * in + g * gs;
      if (mode == kMxfp8) {
        const uint8_t* p = w + r * in + g * gs;
        for (int k = 0; k < gs; ++k) o[k] = t.e4m3[p[k]] * s;
      } else {
        const uint8_t* p = w + (r * in + g * gs) / 2;
        for (int k = 0; k < gs / 2; ++k) {
          o[2 * k] = kFp4[p[k] & 15] * s;
          o[2 * k + 1] = kFp4[p[k] >> 4] * s;
        }
      }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QM_HAVE_AVX2 1
// AVX2: FP4: 8 nibbles of one uint32 into 8 lanes (variable shifts), the magnitude by a
// register table lookup (vpermps on the 8 non-negative values), the sign bit moved to bit 31;
// FP8: 8 bytes zero-extended to lanes, the E4M3 value by bit arithmetic (a gather from the
// 256-entry table measured ~5x slower)
__attribute__((target("avx2"))) void dequant_avx2(const uint8_t* w, const uint8_t* sc,
                                                  float* dst, int64_t out, int64_t in, int gs,
                                                  int mode) {
  const Tables& t = tables();
  const float* scale_of = mode == kNvfp4 ? t.e4m3 : t.e8m0;
  const int64_t groups = in / gs;
  const __m256 MAG = _mm256_loadu_ps(kFp4);
  const __m256i SH = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i LOW = _mm256_set1_epi32(7), SIGN = _mm256_set1_epi32(8);
  const __m256i E4M3_EM = _mm256_set1_epi32(0x7f), E4M3_SIGN = _mm256_set1_epi32(0x80);
  const __m256 P120 = _mm256_set1_ps(0x1p120f), QNAN = _mm256_set1_ps(std::nanf(""));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 S = _mm256_set1_ps(scale_of[sc[r * groups + g]]);
      float* o = dst + r * in + g * gs;
      if (mode == kMxfp8) {
        const uint8_t* p = w + r * in + g * gs;
        for (int k = 0; k < gs; k += 8) {
          const __m256i c = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k)));
          // exponent and mantissa to float32's places, times 2^120 (the biases' difference):
          // exact for normal and subnormal E4M3; the sign to bit 31; S.1111.111 NaN
          const __m256i em = _mm256_and_si256(c, E4M3_EM);
          __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 20)), P120);
          v = _mm256_blendv_ps(v, QNAN, _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, E4M3_EM)));
          v = _mm256_or_ps(v, _mm256_castsi256_ps(
                                  _mm256_slli_epi32(_mm256_and_si256(c, E4M3_SIGN), 24)));
          _mm256_storeu_ps(o + k, _mm256_mul_ps(v, S));
        }
      } else {
        const uint8_t* p = w + (r * in + g * gs) / 2;
        for (int k = 0; k < gs; k += 8) {
          uint32_t u;
          std::memcpy(&u, p + k / 2, 4);
          const __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(int(u)), SH);
          __m256 v = _mm256_permutevar8x32_ps(MAG, _mm256_and_si256(c, LOW));
          const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, SIGN), 28);
          v = _mm256_xor_ps(v, _mm256_castsi256_ps(sign));
          _mm256_storeu_ps(o + k, _mm256_mul_ps(v, S));
        }
      }
    }
}
#endif

int mode_of(const std::string& mode) {
  if (mode == "mxfp4") return kMxfp4;
  if (mode == "mxfp8") return kMxfp8;
  if (mode == "nvfp4") return kNvfp4;
  throw std::invalid_argument("qkernel: mode must be mxfp4, mxfp8 or nvfp4, got " + mode);
}

class QDequantModeCpu : public UnaryPrimitive {
 public:
  QDequantModeCpu(Stream s, int group_size, int mode)
      : UnaryPrimitive(s), group_size_(group_size), mode_(mode) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    enc.dispatch([w = array::unsafe_weak_copy(inputs[0]), s = array::unsafe_weak_copy(inputs[1]),
                  o = array::unsafe_weak_copy(out), gs = group_size_, mode = mode_]() mutable {
#ifdef QM_HAVE_AVX2
      if (qk_use_avx2())
        return dequant_avx2(w.data<uint8_t>(), s.data<uint8_t>(), o.data<float>(), o.shape(0),
                            o.shape(1), gs, mode);
#endif
      dequant_portable(w.data<uint8_t>(), s.data<uint8_t>(), o.data<float>(), o.shape(0),
                       o.shape(1), gs, mode);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("QDequantModeCpu has no GPU implementation");
  }
  DEFINE_NAME(QDequantModeCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const QDequantModeCpu&>(other);
    return group_size_ == o.group_size_ && mode_ == o.mode_;
  }

 private:
  int group_size_, mode_;
};

array contig(const array& a, const Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, s);
}

array dequantize_mode_cpu(const array& w, const array& scales, const std::string& mode_name) {
  const int mode = mode_of(mode_name);
  const int gs = mode == kNvfp4 ? 16 : 32, bits = mode == kMxfp8 ? 8 : 4;
  if (w.dtype() != uint32 || scales.dtype() != uint8 || w.ndim() != 2 || scales.ndim() != 2 ||
      scales.shape(0) != w.shape(0) ||
      int64_t(w.shape(1)) * 32 / bits != int64_t(scales.shape(1)) * gs)
    throw std::invalid_argument("qkernel: " + mode_name + " needs w uint32 (out, in * " +
                                std::to_string(bits) + " / 32) and scales uint8 (out, in / " +
                                std::to_string(gs) + ")");
  auto s = to_stream({});
  if (s.device != Device::cpu) throw std::invalid_argument("qkernel: CPU stream only");
  Shape shape = {w.shape(0), scales.shape(1) * gs};
  return array(shape, float32, std::make_shared<QDequantModeCpu>(s, gs, mode),
               {contig(w, s), contig(scales, s)});
}

}  // namespace

void register_qmodes(nb::module_& m) {
  m.def("dequantize_mode", &dequantize_mode_cpu, "w"_a, "scales"_a, "mode"_a,
        "W (out, in) float32 from mx.quantize's (w, scales) in mode mxfp4, mxfp8 or nvfp4 (their "
        "default group sizes and bits); equal to mx.dequantize(..., mode=mode, "
        "dtype=mx.float32); CPU stream.");
}

}  // namespace mlx::core
