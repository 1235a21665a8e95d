#include "resources.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>

namespace dki {

std::string byte_size(uint64_t bytes) {
  char buf[64];
  const char* units[] = {"bytes", "KB", "MB", "GB", "TB", "PB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    u++;
  }
  if (u == 0) return std::to_string(bytes) + " bytes";
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return std::string(buf) + " (" + std::to_string(bytes) + " bytes)";
}

namespace {

constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();

// The first number in a file ("max", a missing file or anything else: kUnknown).
uint64_t number_in(const std::string& path) {
  std::ifstream f(path);
  unsigned long long v = 0;
  if (!(f >> v)) return kUnknown;
  return v;
}

// What this process's memory cgroup still allows (limit − usage), or kUnknown: in a container
// /proc/meminfo shows the host's memory, and the cgroup's limit is what the OOM killer enforces.
// cgroup v2 ("0::/path": memory.max, memory.current) or v1 (the "memory" controller's
// memory.limit_in_bytes, memory.usage_in_bytes), at the process's own path and at the mount's root
// (a container's namespace shows its own cgroup there).
uint64_t cgroup_room() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  uint64_t room = kUnknown;
  const auto consider = [&room](const std::string& dir, const char* limit_file, const char* usage_file) {
    const uint64_t limit = number_in(dir + "/" + limit_file), usage = number_in(dir + "/" + usage_file);
    // v1 reports "no limit" as a huge page-aligned number: anything beyond 2^60 bytes is none.
    if (limit == kUnknown || usage == kUnknown || limit >= (uint64_t(1) << 60)) return;
    room = std::min(room, limit > usage ? limit - usage : 0);
  };
  while (std::getline(cg, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      for (const std::string& dir : {"/sys/fs/cgroup" + path, std::string("/sys/fs/cgroup")}) consider(dir, "memory.max", "memory.current");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      for (const std::string& dir : {"/sys/fs/cgroup/memory" + path, std::string("/sys/fs/cgroup/memory")})
        consider(dir, "memory.limit_in_bytes", "memory.usage_in_bytes");
    }
  }
  return room;
}

}  // namespace

uint64_t host_available_bytes() {
  if (const char* env = std::getenv("DKI_HOST_MEMORY_BYTES")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end != env && *end == '\0') return v;
  }
  uint64_t available = kUnknown;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb) {
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
    meminfo >> unit;  // "kB", absent on a line without a unit; the next read then recovers
  }
  if (available == kUnknown) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) available = uint64_t(pages) * uint64_t(page);
  }
  // Unknown both ways: the allocation itself decides.
  return std::min(available, cgroup_room());
}

void check_host_bytes(uint64_t need, const std::string& what) {
  const uint64_t available = host_available_bytes();
  if (need > available)
    throw SystemError(what + " needs " + byte_size(need) + " of memory; " + byte_size(available) + " is available", "ENOMEM");
}

LazyFloats::LazyFloats(size_t n) : n_(n) {
  if (n == 0) return;
  if (n > std::numeric_limits<size_t>::max() / sizeof(float)) throw std::bad_alloc();
  // MAP_NORESERVE: the range is address space only; the kernel backs (and zero-fills) each page
  // when it is first written, so nothing is charged for the part of the window left unused.
  void* p = mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  p_ = static_cast<float*>(p);
}

LazyFloats::~LazyFloats() {
  if (p_) munmap(p_, n_ * sizeof(float));
}

LazyFloats::LazyFloats(LazyFloats&& o) noexcept : p_(o.p_), n_(o.n_) {
  o.p_ = nullptr;
  o.n_ = 0;
}

LazyFloats& LazyFloats::operator=(LazyFloats&& o) noexcept {
  if (this != &o) {
    if (p_) munmap(p_, n_ * sizeof(float));
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

namespace {

// Index of the first of n elements whose bits, masked, equal the mask: the all-ones exponent of
// NaN and ±inf. The OR over the whole range has no early exit, so the loop vectorises; the index
// is searched for only when there is one. Bits are read with memcpy (no aliasing of floats
// through integer pointers), which compiles to plain loads.
template <class U>
int64_t first_with_exponent(const void* data, size_t n, U mask) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const auto at = [p](size_t i) {
    U u;
    std::memcpy(&u, p + i * sizeof(U), sizeof(U));
    return u;
  };
  unsigned any = 0;
  for (size_t i = 0; i < n; i++) any |= unsigned((at(i) & mask) == mask);
  if (!any) return -1;
  for (size_t i = 0; i < n; i++)
    if ((at(i) & mask) == mask) return int64_t(i);
  return -1;
}

}  // namespace

int64_t first_non_finite(const float* p, size_t n) {
  return first_with_exponent(p, n, uint32_t(0x7f800000u));
}

int64_t first_non_finite(const void* data, DType dtype, size_t n) {
  switch (dtype) {
    case DType::F32: return first_non_finite(static_cast<const float*>(data), n);
    case DType::F16: return first_with_exponent(data, n, uint16_t(0x7c00u));
    case DType::BF16: return first_with_exponent(data, n, uint16_t(0x7f80u));
    case DType::Q8_0: {
      // Each block is an fp16 scale then 32 int8 weights: only the scale can be non-finite. 34-byte
      // blocks leave the scales unaligned for uint16_t, so they are read byte-wise.
      const unsigned char* b = static_cast<const unsigned char*>(data);
      const size_t blocks = n / kQ8Block;
      for (size_t i = 0; i < blocks; i++) {
        uint16_t d;
        std::memcpy(&d, b + i * kQ8BlockBytes, 2);
        if ((d & 0x7c00u) == 0x7c00u) return int64_t(i) * kQ8Block;
      }
      return -1;
    }
  }
  return -1;
}

bool scaled_overflows(float alpha, float abs_max) {
  return !(double(alpha) * double(abs_max) <= double(std::numeric_limits<float>::max()));
}

std::string scaled_overflow_words(float alpha, float abs_max) {
  if (!std::isfinite(abs_max)) return "it already holds a value that is NaN or ±inf";
  char buf[160];
  std::snprintf(buf, sizeof buf, "α = %g times the largest value magnitude %g overflows float32 (max %g)", double(alpha), double(abs_max),
                double(std::numeric_limits<float>::max()));
  return buf;
}

void throw_scaled_overflow(float alpha, float abs_max) {
  throw NonFiniteError("scaleValues: " + scaled_overflow_words(alpha, abs_max), -1, -1);
}

float abs_max(const float* p, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t a;
    std::memcpy(&a, p + i, 4);
    a &= 0x7fffffffu;
    m = a > m ? a : m;
  }
  if (m >= 0x7f800000u) return std::numeric_limits<float>::infinity();
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

}  // namespace dki
