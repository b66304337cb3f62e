// 8-bit weights and 8-bit activations on integer GEMMs (mlx-variants, variants/qkernel).
//
// Three MLX primitives (CPU eval only):
//   Int8GemmCpu    (a uint8 (M, K), b int8 (N, K) [, packed uint8])  -> a @ b.T, int32 (M, N)
//   Int8LinearCpu  (x float32 (M, K), wq int8 (N, K), w_scale float32 (N,), colsum int32 (N,)
//                   [, bias float32 (N,)] [, inv_smooth float32 (K,)] [, packed uint8])
//                   -> y float32 (M, N)
//   Int8PrepackCpu (wq int8 (N, K)) -> packed uint8: int8_prepack.h's blob of wq
// With `packed` (wq's blob, made once per weight set) the GEMM is int8_prepack.h's prepacked
// matmul primitive; without it, or when the blob does not fit, dnnl_gemm_u8s8s32 (the same
// int32 sums).
// Int8LinearCpu quantizes each row (token) of x at run time, asymmetric uint8 (the range
// [min(x, 0), max(x, 0)] in 255 steps, zero point rounded to an integer in [0, 255]):
//   scale_i = (hi_i - lo_i) / 255 (1 when the row is all zero), zp_i = round(-lo_i / scale_i),
//   q_ik = clamp(round(x_ik / scale_i) + zp_i, 0, 255)       (round: half to even)
// multiplies q by the int8 weights with oneDNN's dnnl_gemm_u8s8s32 (int32 accumulation; VNNI,
// AVX-512 or AVX2 kernels chosen by oneDNN at run time), and applies the fp32 epilogue
//   y_ij = (scale_i * w_scale_j) * (C_ij - zp_i * colsum_j) + bias_j
// where colsum_j = sum_k wq_jk (so C - zp * colsum = sum_k (q_ik - zp_i) wq_jk, exactly).
// inv_smooth (SmoothQuant's 1/s per input channel) multiplies x before the quantization.
// Built only where oneDNN's headers and library are found (CMake defines QK_HAVE_DNNL); without
// them `has_dnnl()` is False and the ops raise.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "int8_prepack.h"

#ifdef QK_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
// oneDNN's Debian build threads with OpenMP (libgomp): the op asks for one thread in the MLX
// stream thread that calls it (MLX already splits rows over its CPU streams; an OpenMP team
// per stream oversubscribes the cores and spins when the machine is busy)
extern "C" void omp_set_num_threads(int);
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace mlx::core {

// int8_prepack.h's plain GEMM: oneDNN's dnnl_gemm_u8s8s32 on one OpenMP thread
#ifdef QK_HAVE_DNNL
namespace {
// C = A B^T + beta C (beta 0 or 1: exact int32) on one OpenMP thread
void dnnl_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b,
               int64_t ldb, int32_t* c, int64_t ldc, float beta) {
  const int32_t co = 0;
  thread_local bool one_thread = (omp_set_num_threads(1), true);
  (void)one_thread;
  auto st = dnnl_gemm_u8s8s32('N', 'T', 'F', m, n, k, 1.0f, a, lda, 0, b, ldb, 0, beta, c, ldc,
                              &co);
  if (st != dnnl_success) throw std::runtime_error("int8_linear: dnnl_gemm_u8s8s32 failed");
}
}  // namespace

void int8_gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                    const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc) {
  dnnl_u8s8(m, n, k, a, lda, b, ldb, c, ldc, 0.0f);
}

void int8_gemm_u8s8_acc(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                        const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc) {
  dnnl_u8s8(m, n, k, a, lda, b, ldb, c, ldc, 1.0f);
}
#else
void int8_gemm_u8s8(int64_t, int64_t, int64_t, const uint8_t*, int64_t, const int8_t*, int64_t,
                    int32_t*, int64_t) {
  throw std::runtime_error("int8_linear: built without oneDNN (install libdnnl-dev and rebuild)");
}
void int8_gemm_u8s8_acc(int64_t, int64_t, int64_t, const uint8_t*, int64_t, const int8_t*,
                        int64_t, int32_t*, int64_t) {
  throw std::runtime_error("int8_linear: built without oneDNN (install libdnnl-dev and rebuild)");
}
#endif

namespace {

void gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, const int8_t* b,
               const uint8_t* packed, int32_t* c, bool one = false) {
  if (one)
    int8_gemm_one(m, n, k, a, k, packed, b, k, c, n);
  else
    int8_gemm_any(m, n, k, a, k, packed, b, k, c, n);
}

// one row: its scale and zero point, and the row's uint8 codes
void quantize_row(const float* x, const float* inv_smooth, int64_t k, float* tmp, uint8_t* q,
                  float& scale, int32_t& zp) {
  const float* src = x;
  if (inv_smooth) {
    for (int64_t j = 0; j < k; ++j) tmp[j] = x[j] * inv_smooth[j];
    src = tmp;
  }
  float lo = 0.0f, hi = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    lo = std::min(lo, src[j]);
    hi = std::max(hi, src[j]);
  }
  scale = (hi - lo) / 255.0f;
  if (!(scale > 0.0f)) scale = 1.0f;
  float z = std::nearbyint(-lo / scale);
  z = std::min(255.0f, std::max(0.0f, z));
  zp = int32_t(z);
  for (int64_t j = 0; j < k; ++j) {
    float v = std::nearbyint(src[j] / scale) + z;
    v = std::min(255.0f, std::max(0.0f, v));
    q[j] = uint8_t(v);
  }
}

}  // namespace

bool int8_has_dnnl() {
#ifdef QK_HAVE_DNNL
  return true;
#else
  return false;
#endif
}

class Int8GemmCpu : public UnaryPrimitive {
 public:
  Int8GemmCpu(Stream s, bool has_packed, bool one)
      : UnaryPrimitive(s), has_packed_(has_packed), one_(one) {}
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    enc.dispatch([a = array::unsafe_weak_copy(inputs[0]), b = array::unsafe_weak_copy(inputs[1]),
                  pk = array::unsafe_weak_copy(inputs.back()), hp = has_packed_, one = one_,
                  o = array::unsafe_weak_copy(out)]() mutable {
      gemm_u8s8(a.shape(0), b.shape(0), a.shape(1), a.data<uint8_t>(), b.data<int8_t>(),
                hp ? pk.data<uint8_t>() : nullptr, o.data<int32_t>(), one);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("Int8GemmCpu has no GPU implementation");
  }
  DEFINE_NAME(Int8GemmCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const Int8GemmCpu&>(other);
    return has_packed_ == o.has_packed_ && one_ == o.one_;
  }

 private:
  bool has_packed_, one_;
};

class Int8PrepackCpu : public UnaryPrimitive {
 public:
  explicit Int8PrepackCpu(Stream s) : UnaryPrimitive(s) {}
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    enc.set_input_array(inputs[0]);
    enc.set_output_array(out);
    enc.dispatch([w = array::unsafe_weak_copy(inputs[0]), o = array::unsafe_weak_copy(out)]() mutable {
      if (!int8_prepack(w.data<int8_t>(), w.shape(0), w.shape(1), w.shape(1), o.data<uint8_t>()))
        throw std::runtime_error("int8_prepack: oneDNN could not reorder the weight");
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("Int8PrepackCpu has no GPU implementation");
  }
  DEFINE_NAME(Int8PrepackCpu)
  bool is_equivalent(const Primitive&) const override { return true; }
};

class Int8LinearCpu : public UnaryPrimitive {
 public:
  Int8LinearCpu(Stream s, bool has_bias, bool has_smooth, bool has_packed)
      : UnaryPrimitive(s), has_bias_(has_bias), has_smooth_(has_smooth), has_packed_(has_packed) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& enc = cpu::get_command_encoder(stream());
    out.set_data(allocator::malloc(out.nbytes()));
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    const size_t ib = has_bias_ ? 4 : 0, is = has_smooth_ ? (has_bias_ ? 5 : 4) : 0;
    enc.dispatch([x = array::unsafe_weak_copy(inputs[0]), w = array::unsafe_weak_copy(inputs[1]),
                  ws = array::unsafe_weak_copy(inputs[2]), cs = array::unsafe_weak_copy(inputs[3]),
                  bias = array::unsafe_weak_copy(inputs[ib]),
                  sm = array::unsafe_weak_copy(inputs[is]), hb = has_bias_, hs = has_smooth_,
                  pk = array::unsafe_weak_copy(inputs.back()), hp = has_packed_,
                  o = array::unsafe_weak_copy(out)]() mutable {
      const int64_t m = x.shape(0), k = x.shape(1), n = w.shape(0);
      // scratch from MLX's allocator (counts in mx.get_peak_memory()): codes, int32 product,
      // row scales and zero points, one smoothed row
      const size_t bytes_q = size_t(m * k), bytes_c = size_t(m * n) * 4;
      auto buf = allocator::allocator().malloc(bytes_q + bytes_c + size_t(m) * 8 + size_t(k) * 4 + 64);
      char* base = static_cast<char*>(buf.raw_ptr());
      int32_t* c = reinterpret_cast<int32_t*>(base);
      float* rs = reinterpret_cast<float*>(base + bytes_c);
      int32_t* zp = reinterpret_cast<int32_t*>(base + bytes_c + size_t(m) * 4);
      float* tmp = reinterpret_cast<float*>(base + bytes_c + size_t(m) * 8);
      uint8_t* q = reinterpret_cast<uint8_t*>(base + bytes_c + size_t(m) * 8 + size_t(k) * 4);
      const float* xp = x.data<float>();
      const float* smp = hs ? sm.data<float>() : nullptr;
      for (int64_t i = 0; i < m; ++i) quantize_row(xp + i * k, smp, k, tmp, q + i * k, rs[i], zp[i]);
      gemm_u8s8(m, n, k, q, w.data<int8_t>(), hp ? pk.data<uint8_t>() : nullptr, c);
      const float* wsp = ws.data<float>();
      const int32_t* csp = cs.data<int32_t>();
      const float* bp = hb ? bias.data<float>() : nullptr;
      float* y = o.data<float>();
      for (int64_t i = 0; i < m; ++i) {
        const int32_t* ci = c + i * n;
        float* yi = y + i * n;
        const float si = rs[i];
        const int32_t zi = zp[i];
        for (int64_t j = 0; j < n; ++j) {
          float v = (si * wsp[j]) * float(ci[j] - zi * csp[j]);
          yi[j] = bp ? v + bp[j] : v;
        }
      }
      allocator::allocator().free(buf);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("Int8LinearCpu has no GPU implementation");
  }
  DEFINE_NAME(Int8LinearCpu)
  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const Int8LinearCpu&>(other);
    return has_bias_ == o.has_bias_ && has_smooth_ == o.has_smooth_ &&
           has_packed_ == o.has_packed_;
  }

 private:
  bool has_bias_, has_smooth_, has_packed_;
};

namespace {

// the int32 sums (and zp x colsum) are exact while 255 x 128 x K < 2^31
void check_k(int64_t k) {
  if (k > 65793)
    throw std::invalid_argument("int8: K = " + std::to_string(k) + " inputs; int32 sums are "
                                "exact up to 65793 (255 x 128 x K < 2^31)");
}

Stream cpu_stream() {
  auto s = to_stream({});
  if (s.device != Device::cpu) throw std::invalid_argument("int8_linear: CPU stream only");
  return s;
}

array rowmajor(const array& a, const Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, s);
}

void check_vec(const std::optional<array>& v, int64_t n, Dtype dt, const char* what) {
  if (v && (v->dtype() != dt || v->ndim() != 1 || v->shape(0) != n))
    throw std::invalid_argument(std::string("int8_linear: ") + what + " has the wrong dtype or shape");
}

// a blob of int8_prepack's size for a weight (n, k), as a row-major uint8 vector
void check_packed(const std::optional<array>& p, int64_t n, int64_t k) {
  if (p && (p->dtype() != uint8 || p->ndim() != 1 || p->shape(0) != int8_prepack_bytes(n, k)))
    throw std::invalid_argument("int8: packed must be int8_prepack(wq) of this weight (uint8)");
}

}  // namespace

array int8_gemm_cpu(const array& a, const array& b, const std::optional<array>& packed,
                    bool one_gemm) {
  if (!int8_has_dnnl()) throw std::runtime_error("int8_gemm: built without oneDNN");
  if (a.dtype() != uint8 || b.dtype() != int8 || a.ndim() != 2 || b.ndim() != 2 ||
      a.shape(1) != b.shape(1))
    throw std::invalid_argument("int8_gemm: a must be uint8 (M, K) and b int8 (N, K)");
  check_packed(packed, b.shape(0), b.shape(1));
  check_k(a.shape(1));
  auto s = cpu_stream();
  std::vector<array> in = {rowmajor(a, s), rowmajor(b, s)};
  if (packed) in.push_back(rowmajor(*packed, s));
  return array({a.shape(0), b.shape(0)}, int32, std::make_shared<Int8GemmCpu>(s, bool(packed), one_gemm),
               in);
}

std::optional<array> int8_prepack_cpu(const array& wq) {
  if (wq.dtype() != int8 || wq.ndim() != 2)
    throw std::invalid_argument("int8_prepack: wq must be int8 (out, in)");
  const int64_t bytes = int8_prepack_bytes(wq.shape(0), wq.shape(1));
  if (bytes == 0) return std::nullopt;
  auto s = cpu_stream();
  return array({int(bytes)}, uint8, std::make_shared<Int8PrepackCpu>(s), {rowmajor(wq, s)});
}

array int8_linear_cpu(const array& x, const array& wq, const array& w_scale, const array& colsum,
                      const std::optional<array>& bias, const std::optional<array>& inv_smooth,
                      const std::optional<array>& packed) {
  if (!int8_has_dnnl()) throw std::runtime_error("int8_linear: built without oneDNN");
  if (wq.dtype() != int8 || wq.ndim() != 2)
    throw std::invalid_argument("int8_linear: wq must be int8 (out, in)");
  const int n = wq.shape(0), k = wq.shape(1);
  if (x.dtype() != float32 || x.ndim() < 1 || x.shape(-1) != k)
    throw std::invalid_argument("int8_linear: x must be float32 (..., in)");
  check_vec(w_scale, n, float32, "w_scale");
  check_vec(colsum, n, int32, "colsum");
  check_vec(bias, n, float32, "bias");
  check_vec(inv_smooth, k, float32, "inv_smooth");
  check_k(k);
  check_packed(packed, n, k);
  auto s = cpu_stream();
  const int m = x.size() / k;
  std::vector<array> in = {contiguous(reshape(x, {m, k}, s), false, s), rowmajor(wq, s),
                           rowmajor(w_scale, s), rowmajor(colsum, s)};
  if (bias) in.push_back(rowmajor(*bias, s));
  if (inv_smooth) in.push_back(rowmajor(*inv_smooth, s));
  if (packed) in.push_back(rowmajor(*packed, s));
  auto y = array({m, n}, float32,
                 std::make_shared<Int8LinearCpu>(s, bool(bias), bool(inv_smooth), bool(packed)),
                 in);
  Shape shape = x.shape();
  shape.back() = n;
  return reshape(y, shape, s);
}

void register_int8_linear(nb::module_& m) {
  m.def("has_dnnl", &int8_has_dnnl, "Whether the int8 ops were built with oneDNN.");
  m.def("has_prepack", [] { return int8_prepack_bytes(64, 64) > 0; },
        "Whether oneDNN's u8 x s8 matmul primitive takes prepacked weights here.");
  m.def("int8_scheme", &int8_scheme,
        "How the int8 GEMMs get exact int32 sums here: 'u8s8' (one oneDNN u8 x s8 GEMM: VNNI or "
        "AMX) or 'u8s8-split7' (codes split into two 7-bit halves, two GEMMs: CPUs without VNNI, "
        "whose u8 x s8 kernels saturate 16-bit pair sums); 'none' where neither probed exact; '' "
        "without oneDNN.");
  m.def("int8_prepack_max_rows", &int8_prepack_max_rows,
        "Rows above which a call runs dnnl_gemm_u8s8s32 even with a blob (no cut on AMX).");
  m.def("int8_cpu_isa", &int8_cpu_isa,
        "oneDNN's effective CPU ISA (honours ONEDNN_MAX_CPU_ISA), e.g. 'avx2', 'avx512_core_amx'.");
  m.def("int8_prepack", &int8_prepack_cpu, "wq"_a,
        "wq int8 (N, K) reordered once for oneDNN's matmul primitive: a uint8 blob to pass as "
        "`packed` (int8_prepack.h), or None where no such primitive exists.");
  m.def("int8_prepack_bytes", &int8_prepack_bytes, "n"_a, "k"_a,
        "Bytes of int8_prepack's blob of an int8 weight (n, k); 0 where none can be made.");
  m.def("int8_prepack_impl", &int8_prepack_impl, "m"_a, "n"_a, "k"_a,
        "oneDNN's implementation of the prepacked matmul for (M, N, K) ('' when none).");
  m.def("int8_prepack_refusals", &int8_prepack_refusals,
        "Calls whose blob did not fit (they ran dnnl_gemm_u8s8s32) since the process started.");
  m.def("int8_gemm", &int8_gemm_cpu, "a"_a, "b"_a, "packed"_a = nb::none(),
        "one_gemm"_a = false,
        "a @ b.T as int32 (M, N) for uint8 a (M, K) and int8 b (N, K), exact on every ISA "
        "(int8_scheme()): the prepacked matmul with packed = int8_prepack(b) up to 512 rows, "
        "else dnnl_gemm_u8s8s32. one_gemm=True: one oneDNN GEMM without the split, which "
        "saturates where int8_scheme() is 'u8s8-split7' (benchmarks, tests).");
  m.def("int8_linear", &int8_linear_cpu, "x"_a, "wq"_a, "w_scale"_a, "colsum"_a,
        "bias"_a = nb::none(), "inv_smooth"_a = nb::none(), "packed"_a = nb::none(),
        "W8A8 Linear: x (..., in) float32 quantized per row to uint8, times int8 wq (out, in) "
        "on integer GEMMs (prepacked with packed = int8_prepack(wq)), fp32 epilogue with "
        "w_scale (out,), colsum (out,) int32, bias.");
}

}  // namespace mlx::core
