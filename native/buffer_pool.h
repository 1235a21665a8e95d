// Freed buffers kept for reuse, up to a byte cap: K/V block memory on the host (kv_buffer.cpp)
// and on each GPU (cuda/device_kv.cu). A block restored from a cache tier right after another was
// evicted then lands in memory that is already mapped (host: no page faults) or allocated
// (GPU: no cudaMalloc, and no cudaFree, which waits for the whole device).
#pragma once
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace dki {

// Pool size classes: whole 2 MiB steps from 2 MiB up, 64 KiB steps below.
inline size_t pool_size_class(size_t bytes) {
  const size_t step = bytes >= (size_t(2) << 20) ? size_t(2) << 20 : size_t(64) << 10;
  return (bytes + step - 1) / step * step;
}

class BufferPool {
 public:
  using FreeFn = std::function<void(void*)>;
  BufferPool(FreeFn free_fn, size_t cap) : free_fn_(std::move(free_fn)), cap_(cap) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A kept buffer of `size` bytes (the most recently kept: warmest in cache), or nullptr.
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->first != size) continue;
      void* p = it->second;
      held_ -= size;
      kept_.erase(std::next(it).base());
      return p;
    }
    return nullptr;
  }

  // Keeps p (size bytes) for a later take(size), freeing the oldest kept buffers as needed to
  // stay within the cap; frees p itself when it alone is over the cap.
  void give(void* p, size_t size) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (size > cap_) {
        drop.push_back(p);
      } else {
        drop = trim(cap_ - size);
        kept_.emplace_back(size, p);
        held_ += size;
      }
    }
    for (void* d : drop) free_fn_(d);  // outside the lock: a free may be slow (cudaFree syncs)
  }

  void set_cap(size_t bytes) { shrink(bytes, true); }
  // Frees every kept buffer (the cap stays): for a caller that ran out of memory.
  void drain() { shrink(0, false); }

  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

 private:
  FreeFn free_fn_;
  std::mutex mutex_;
  std::deque<std::pair<size_t, void*>> kept_;  // (size, buffer), oldest first
  size_t held_ = 0;
  size_t cap_;

  void shrink(size_t limit, bool new_cap) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (new_cap) cap_ = limit;
      drop = trim(limit);
    }
    for (void* d : drop) free_fn_(d);
  }

  // Removes the oldest buffers until at most `limit` bytes are kept; returns them to be freed.
  std::vector<void*> trim(size_t limit) {
    std::vector<void*> out;
    while (held_ > limit && !kept_.empty()) {
      held_ -= kept_.front().first;
      out.push_back(kept_.front().second);
      kept_.pop_front();
    }
    return out;
  }
};

}  // namespace dki
