// The memory behind K/V blocks (see kv_block.h): buffers from 256 KiB up are kept in a bounded
// pool when freed (buffer_pool.h), and those from 2 MiB up are 2 MiB-aligned and marked for
// transparent huge pages.
#include <cstdlib>
#include <new>

#include "buffer_pool.h"
#include "kv_block.h"
#if defined(__linux__)
#include <sys/mman.h>
#endif
#ifdef DKI_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace dki {
namespace {

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kPooledFrom = size_t(256) << 10;  // smaller buffers: plain malloc

BufferPool& pool() {
  static BufferPool* p = new BufferPool(std::free, size_t(256) << 20);  // never destroyed: blocks may be freed during static destruction
  return *p;
}

}  // namespace

void* kv_buffer_alloc(size_t bytes) {
  if (bytes < kPooledFrom) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t size = pool_size_class(bytes);
  if (void* p = pool().take(size)) return p;
  void* p = std::aligned_alloc(size >= kHuge ? kHuge : 64, size);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (size >= kHuge) madvise(p, size, MADV_HUGEPAGE);  // a hint: ignored where THP is off
#endif
  return p;
}

void kv_buffer_free(void* p, size_t bytes) {
  if (!p) return;
  if (bytes < kPooledFrom) return std::free(p);
  pool().give(p, pool_size_class(bytes));
}

void set_kv_pool_bytes(size_t bytes) {
  pool().set_cap(bytes);
#ifdef DKI_CUDA
  cuda_set_pool_bytes(bytes);
#endif
}

size_t kv_pool_bytes() { return pool().held(); }

}  // namespace dki
