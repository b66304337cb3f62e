// Prepacked int8 weights for oneDNN's matmul primitive: see int8_prepack.h.

#include "int8_prepack.h"

#ifdef QK_HAVE_DNNL
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

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

#else  // built without oneDNN: nothing is packed, every caller runs its plain path

int64_t int8_prepack_bytes(int64_t, int64_t) { return 0; }
bool int8_prepack(const int8_t*, int64_t, int64_t, int64_t, uint8_t*) { return false; }
bool int8_gemm_prepacked(int64_t, int64_t, int64_t, const uint8_t*, int64_t, const uint8_t*,
                         int32_t*, int64_t) {
  return false;
}
std::string int8_prepack_impl(int64_t, int64_t, int64_t) { return ""; }
int64_t int8_prepack_refusals() { return 0; }

#endif

}  // namespace mlx::core
