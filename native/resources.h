// Resource limits and numeric health: the memory a request will take is checked before it is
// allocated, and values that went non-finite are found where they enter, not as a stream of
// token 0 at the end.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common.h"

namespace dki {

// "46.1 GB (46080000000 bytes)": errors name sizes both ways, readable and exact.
std::string byte_size(uint64_t bytes);

// Host memory a new allocation can take without pushing the system into swap or the OOM killer:
// MemAvailable on Linux (else the physical memory), bounded by what the process's memory cgroup
// still allows (a container's limit, which /proc/meminfo does not show). DKI_HOST_MEMORY_BYTES
// overrides both (tests; a limit enforced some other way).
uint64_t host_available_bytes();

// Throws a SystemError with code "ENOMEM" naming `what`, the bytes it needs and the bytes
// available when `need` exceeds host_available_bytes(). Called before allocating anything sized
// by the caller's input.
void check_host_bytes(uint64_t need, const std::string& what);

// Zero-filled float storage whose pages exist only once written: an address range reserved up
// front (so the layout and every pointer into it are fixed) and backed by the kernel page by page
// as tokens fill it. A 128K-token K/V window holding 100 tokens costs 100 tokens of RAM.
class LazyFloats {
 public:
  LazyFloats() = default;
  explicit LazyFloats(size_t n);
  ~LazyFloats();
  LazyFloats(const LazyFloats&) = delete;
  LazyFloats& operator=(const LazyFloats&) = delete;
  LazyFloats(LazyFloats&& o) noexcept;
  LazyFloats& operator=(LazyFloats&& o) noexcept;

  float* data() { return p_; }
  const float* data() const { return p_; }
  size_t size() const { return n_; }
  float& operator[](size_t i) { return p_[i]; }
  const float& operator[](size_t i) const { return p_[i]; }

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
};

// Thrown when a value the engine produced or was given is NaN or ±inf. `segment` is the index of
// the injected segment at fault (-1: none in particular), `row` the eval row whose logits were
// not finite (-1: not about logits); the binding passes both on to JavaScript.
struct NonFiniteError : Error {
  NonFiniteError(const std::string& msg, int segment, int row) : Error(msg), segment(segment), row(row) {}
  int segment;
  int row;
};

// Whether α·v overflows float32 for a block whose largest |value| is abs_max (+inf: it holds a
// NaN/inf already), and the words for it: "α = 1e+38 times the largest value magnitude 3.2
// overflows float32 (max 3.40282e+38)". Value scaling checks this wherever it scales (scaleValues
// on either device, injection), as the f16 storage path refuses values beyond its range.
bool scaled_overflows(float alpha, float abs_max);
std::string scaled_overflow_words(float alpha, float abs_max);
// Throws NonFiniteError for scaleValues: its α overflows the block's values, or they were not finite.
[[noreturn]] void throw_scaled_overflow(float alpha, float abs_max);

// Index of the first NaN/±inf of n floats, or -1. Exponent bits only: vectorises, and a scan
// of a decode step's logits costs microseconds.
int64_t first_non_finite(const float* p, size_t n);

// The same for n elements of a stored tensor (F32, F16, BF16; Q8_0 by its block scales, the
// index then being the first element of the block).
int64_t first_non_finite(const void* data, DType dtype, size_t n);

// The largest |x| of n floats; +inf when any of them is NaN or ±inf.
float abs_max(const float* p, size_t n);

}  // namespace dki
