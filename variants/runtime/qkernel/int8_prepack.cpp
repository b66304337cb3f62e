// Prepacked int8 weights for oneDNN's matmul primitive: see int8_prepack.h.

#include "int8_prepack.h"

#ifdef QK_HAVE_DNNL
#include <algorithm>
#include <climits>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
extern "C" void omp_set_num_threads(int);  // as int8_linear.cpp: one OpenMP thread per caller
#endif

namespace mlx::core {

#ifdef QK_HAVE_DNNL
namespace {

using namespace dnnl;

constexpr uint32_t kMagic = 0x31504b51;  // "QKP1"
constexpr int64_t kHeader = 64, kAlign = 64;
constexpr int64_t kPackRows = 32;  // the row count whose primitive picks the packed layout
constexpr size_t kMaxEntries = 1024;  // primitives cached (a few kB each); then the cache restarts

struct Header {
  uint32_t magic, pad;
  int64_t n, k, bytes, offset;  // packed bytes; offset of the packed data from the blob's start
  uint64_t layout;              // fingerprint of the packed layout
};
static_assert(sizeof(Header) <= kHeader, "header");

std::atomic<int64_t> refusals{0};

engine& eng() {
  static engine e(engine::kind::cpu, 0);
  return e;
}

void one_thread() {
  thread_local bool once = (omp_set_num_threads(1), true);
  (void)once;
}

// FNV-1a over the fields that define a memory layout (dims, type, blocking, extra flags)
uint64_t fingerprint(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ uint64_t((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  mix(d.ndims), mix(d.data_type), mix(d.format_kind), mix(d.offset0);
  for (int i = 0; i < d.ndims; ++i) mix(d.dims[i]), mix(d.padded_dims[i]), mix(d.padded_offsets[i]);
  if (d.format_kind == dnnl_blocked) {
    const auto& b = d.format_desc.blocking;
    for (int i = 0; i < d.ndims; ++i) mix(b.strides[i]);
    mix(b.inner_nblks);
    for (int i = 0; i < b.inner_nblks; ++i) mix(b.inner_blks[i]), mix(b.inner_idxs[i]);
  }
  mix(d.extra.flags), mix(d.extra.compensation_mask), mix(d.extra.asymm_compensation_mask);
  return h;
}

matmul::primitive_desc make_pd(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldc) {
  memory::desc ad({m, k}, memory::data_type::u8, memory::dims{lda, 1});
  memory::desc bd({k, n}, memory::data_type::s8, memory::format_tag::any);
  memory::desc cd({m, n}, memory::data_type::s32, memory::dims{ldc, 1});
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  return matmul::primitive_desc(matmul::desc(ad, bd, cd), attr, eng());
}

struct Entry {
  matmul prim;
  memory::desc ad, wd, cd, sd;
  uint64_t layout;
  std::string impl;
};

std::mutex mu;
std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, std::shared_ptr<Entry>> cache;

// the primitive for (m, n, k, lda, ldc), made on first use; null when oneDNN refuses it
std::shared_ptr<Entry> entry(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldc) {
  const auto key = std::make_tuple(m, n, k, lda, ldc);
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::shared_ptr<Entry> e;
  try {
    auto pd = make_pd(m, n, k, lda, ldc);
    e = std::make_shared<Entry>(Entry{matmul(pd), pd.src_desc(), pd.weights_desc(), pd.dst_desc(),
                                      pd.scratchpad_desc(), fingerprint(pd.weights_desc()),
                                      std::string(pd.impl_info_str())});
  } catch (const dnnl::error&) {
    e = nullptr;
  }
  std::lock_guard<std::mutex> g(mu);
  if (cache.size() >= kMaxEntries) cache.clear();  // in-use entries live on in their shared_ptr
  return cache.emplace(key, e).first->second;
}

}  // namespace

int64_t int8_prepack_bytes(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0) return 0;
  auto e = entry(kPackRows, n, k, k, n);
  return e ? kHeader + kAlign + int64_t(e->wd.get_size()) : 0;
}

bool int8_prepack(const int8_t* w, int64_t n, int64_t k, int64_t ldw, uint8_t* dst) {
  if (n <= 0 || k <= 0) return false;
  auto e = entry(kPackRows, n, k, k, n);
  if (!e) return false;
  one_thread();
  Header h{kMagic, 0, n, k, int64_t(e->wd.get_size()), 0, e->layout};
  h.offset = kHeader + int64_t((kAlign - reinterpret_cast<uintptr_t>(dst + kHeader) % kAlign) %
                               kAlign);
  std::memset(dst, 0, size_t(kHeader + kAlign));
  try {
    // w (n, k) row-major is B^T: B (k, n) with strides (1, ldw)
    memory src(memory::desc({k, n}, memory::data_type::s8, memory::dims{1, ldw}), eng(),
               const_cast<int8_t*>(w));
    memory out(e->wd, eng(), dst + h.offset);
    stream s(eng());
    reorder(src, out).execute(s, src, out);
    s.wait();
  } catch (const dnnl::error&) {
    return false;
  }
  std::memcpy(dst, &h, sizeof(h));
  return true;
}

bool int8_gemm_prepacked(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                         const uint8_t* packed, int32_t* c, int64_t ldc) {
  Header h;
  std::memcpy(&h, packed, sizeof(h));
  if (h.magic != kMagic || h.n != n || h.k != k) {
    ++refusals;
    return false;
  }
  if (m == 0) return true;
  auto e = entry(m, n, k, lda, ldc);
  if (!e || e->layout != h.layout || int64_t(e->wd.get_size()) != h.bytes) {
    ++refusals;
    return false;
  }
  one_thread();
  // a stream and a scratchpad per calling thread: two threads on one primitive must not share
  // the scratchpad (its partial sums would mix)
  thread_local stream s(eng());
  thread_local std::vector<char> scratch;
  if (scratch.size() < e->sd.get_size()) scratch.resize(e->sd.get_size());
  memory am(e->ad, eng(), const_cast<uint8_t*>(a));
  memory wm(e->wd, eng(), const_cast<uint8_t*>(packed + h.offset));
  memory cm(e->cd, eng(), c);
  memory sm(e->sd, eng(), scratch.data());
  e->prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm},
                      {DNNL_ARG_SCRATCHPAD, sm}});
  s.wait();
  return true;
}

std::string int8_prepack_impl(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return "";
  auto e = entry(m, n, k, k, n);
  return e ? e->impl : "";
}

int64_t int8_prepack_refusals() { return refusals.load(); }

// the one-GEMM path: the prepacked matmul where the blob fits, else dnnl_gemm_u8s8s32
bool int8_gemm_one(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                 const uint8_t* packed, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc) {
  if (packed && m <= int8_prepack_max_rows() &&
      int8_gemm_prepacked(m, n, k, a, lda, packed, c, ldc))
    return true;
  int8_gemm_u8s8(m, n, k, a, lda, b, ldb, c, ldc);
  return false;
}

namespace {

// whether the effective ISA has VNNI or AMX (dnnl_cpu_isa_t: avx512_core_vnni 0x67 and the ISAs
// above it carry bit 0x40, avx2_vnni 0x407 bit 0x400)
bool isa_has_vnni() {
  const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
  return (isa & 0x440u) != 0;
}

// one saturating case through both one-GEMM paths: all codes 255 times all weights 127
// (every 16-bit pair sum 64770 would saturate to 32767) at a few row counts
bool probe_exact() {
  const int64_t n = 64, k = 64;
  std::vector<int8_t> w(size_t(n * k), int8_t(127));
  std::vector<uint8_t> blob;
  const int64_t bytes = int8_prepack_bytes(n, k);
  if (bytes > 0) {
    blob.resize(size_t(bytes));
    if (!int8_prepack(w.data(), n, k, k, blob.data())) blob.clear();
  }
  for (int64_t m : {1, 24, 600}) {
    std::vector<uint8_t> a(size_t(m * k), uint8_t(255));
    std::vector<int32_t> c(size_t(m * n), 0);
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1 && blob.empty()) break;
      std::fill(c.begin(), c.end(), 0);
      int8_gemm_one(m, n, k, a.data(), k, pass ? blob.data() : nullptr, w.data(), k, c.data(), n);
      for (int32_t v : c)
        if (v != 255 * 127 * int32_t(k)) return false;
    }
  }
  return true;
}

bool exact_u8s8() {
  static const bool ok = isa_has_vnni() && probe_exact();
  return ok;
}

}  // namespace

bool int8_gemm_any(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                   const uint8_t* packed, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return false;
  if (exact_u8s8()) return int8_gemm_one(m, n, k, a, lda, packed, b, ldb, c, ldc);
  // split: lo = min(a, 127), hi = a - lo; C = lo B^T + hi B^T (int8_prepack.h). Per-thread
  // buffers (kept between calls; not from MLX's allocator, so not in mx.get_peak_memory())
  thread_local std::vector<uint8_t> lo, hi;
  thread_local std::vector<int32_t> t;
  const size_t mk = size_t(m * k), mn = size_t(m * n);
  if (lo.size() < mk) lo.resize(mk), hi.resize(mk);
  if (packed && m <= int8_prepack_max_rows() && t.size() < mn) t.resize(mn);
  uint8_t* __restrict pl = lo.data();
  uint8_t* __restrict ph = hi.data();
  for (int64_t i = 0; i < m; ++i) {
    const uint8_t* ai = a + i * lda;
    for (int64_t j = 0; j < k; ++j) {
      const uint8_t v = ai[j], l = v < 127 ? v : uint8_t(127);
      pl[i * k + j] = l;
      ph[i * k + j] = uint8_t(v - l);
    }
  }
  const bool prepacked = int8_gemm_one(m, n, k, pl, k, packed, b, ldb, c, ldc);
  if (!prepacked) {  // the plain GEMM adds the second half into C itself
    int8_gemm_u8s8_acc(m, n, k, ph, k, b, ldb, c, ldc);
    return false;
  }
  // the prepacked GEMM takes no beta: the second half into a buffer (either path: exact)
  int8_gemm_one(m, n, k, ph, k, packed, b, ldb, t.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    int32_t* __restrict ci = c + i * ldc;
    const int32_t* ti = t.data() + i * n;
    for (int64_t j = 0; j < n; ++j) ci[j] += ti[j];
  }
  return prepacked;
}

// the split itself on the same saturating extremes and on weights -128 (int8_gemm_any's claim
// for every int8 b): where even that comes back wrong no scheme here is exact ("none")
bool split_exact() {
  const int64_t n = 64, k = 64, m = 24;
  for (int w8 : {127, -128}) {
    std::vector<int8_t> w(size_t(n * k), int8_t(w8));
    std::vector<uint8_t> a(size_t(m * k), uint8_t(255));
    std::vector<int32_t> c(size_t(m * n), 0);
    int8_gemm_any(m, n, k, a.data(), k, nullptr, w.data(), k, c.data(), n);
    for (int32_t v : c)
      if (v != 255 * w8 * int32_t(k)) return false;
  }
  return true;
}

std::string int8_scheme() {
  static const std::string s = exact_u8s8() ? "u8s8" : split_exact() ? "u8s8-split7" : "none";
  return s;
}

int64_t int8_prepack_max_rows() {
  static const int64_t rows =
      dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx ? INT64_MAX : kInt8PrepackMaxRows;
  return rows;
}

std::string int8_cpu_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "isa-" + std::to_string(int(dnnl_get_effective_cpu_isa()));
  }
}

#else  // built without oneDNN: nothing is packed, every caller runs its plain path

int64_t int8_prepack_bytes(int64_t, int64_t) { return 0; }
bool int8_prepack(const int8_t*, int64_t, int64_t, int64_t, uint8_t*) { return false; }
bool int8_gemm_prepacked(int64_t, int64_t, int64_t, const uint8_t*, int64_t, const uint8_t*,
                         int32_t*, int64_t) {
  return false;
}
std::string int8_prepack_impl(int64_t, int64_t, int64_t) { return ""; }
int64_t int8_prepack_refusals() { return 0; }
bool int8_gemm_one(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda, const uint8_t*,
                   const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc) {
  int8_gemm_u8s8(m, n, k, a, lda, b, ldb, c, ldc);  // throws: built without oneDNN
  return false;
}
bool int8_gemm_any(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda, const uint8_t*,
                   const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc) {
  int8_gemm_u8s8(m, n, k, a, lda, b, ldb, c, ldc);  // throws: built without oneDNN
  return false;
}
std::string int8_scheme() { return ""; }
int64_t int8_prepack_max_rows() { return kInt8PrepackMaxRows; }
std::string int8_cpu_isa() { return ""; }

#endif

}  // namespace mlx::core
