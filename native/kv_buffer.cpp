// The memory behind K/V blocks (see kv_block.h): buffers from 256 KiB up are kept in a bounded
// pool when freed, and those from 2 MiB up are 2 MiB-aligned and marked for transparent huge pages. A block restored from the L2/L3
// tier right after another was evicted then writes into pages that are already mapped, instead
// of taking a fault (and a kernel zero-fill) for every page of a fresh buffer.
#include <cstdlib>
#include <deque>
#include <mutex>
#include <new>
#include <utility>

#include "kv_block.h"
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace dki {
namespace {

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kPooledFrom = size_t(256) << 10;  // smaller buffers: plain malloc

struct Pool {
  std::mutex mutex;
  std::deque<std::pair<size_t, void*>> free;  // (rounded size, buffer), oldest first
  size_t held = 0;
  size_t cap = size_t(256) << 20;

  // Frees the oldest buffers until at most `limit` bytes are held. Caller holds the mutex.
  void trim(size_t limit) {
    while (held > limit && !free.empty()) {
      held -= free.front().first;
      std::free(free.front().second);
      free.pop_front();
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: blocks may be freed during static destruction
  return *p;
}

// Pool size classes: whole huge pages from 2 MiB up, 64 KiB steps below.
size_t rounded(size_t bytes) {
  const size_t step = bytes >= kHuge ? kHuge : size_t(64) << 10;
  return (bytes + step - 1) / step * step;
}

}  // namespace

void* kv_buffer_alloc(size_t bytes) {
  if (bytes < kPooledFrom) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t size = rounded(bytes);
  {
    Pool& P = pool();
    std::lock_guard<std::mutex> lock(P.mutex);
    for (auto it = P.free.rbegin(); it != P.free.rend(); ++it) {  // newest first: warmest in cache
      if (it->first != size) continue;
      void* p = it->second;
      P.held -= size;
      P.free.erase(std::next(it).base());
      return p;
    }
  }
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
  const size_t size = rounded(bytes);
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mutex);
  if (size > P.cap) return std::free(p);
  P.trim(P.cap - size);
  P.free.emplace_back(size, p);
  P.held += size;
}

void set_kv_pool_bytes(size_t bytes) {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mutex);
  P.cap = bytes;
  P.trim(bytes);
}

size_t kv_pool_bytes() {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mutex);
  return P.held;
}

}  // namespace dki
