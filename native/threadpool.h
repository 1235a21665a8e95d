// A fixed pool of worker threads for data-parallel loops. The caller thread takes part in every
// loop. A loop is cut into a few chunks per thread that the threads claim one at a time, so a
// thread the OS has taken off its core holds up at most the one chunk it is running: the others
// take the rest. Threads that wait (workers for the next loop, the caller for the last chunks)
// spin briefly, then yield their core, then sleep on a futex: on a machine with more runnable
// threads than cores a waiting thread does not keep the thread it waits for off a core.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dki {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();

  int size() const { return n_threads_; }

  // Runs fn(begin, end) over [0, n) cut into contiguous chunks whose boundaries are multiples of
  // `align` and depend only on n, align and the thread count (never on timing), so a kernel that
  // computes each row alone gives the same bits whichever thread ran a chunk. Blocks until all
  // chunks finish. Only one loop runs at a time: concurrent callers are serialised.
  void parallel_for(int n, int align, const std::function<void(int, int)>& fn);

 private:
  void worker();
  // Claims and runs chunks of the current loop until none is left.
  void run_chunks();
  // Chunk k of `chunks`, in whole units of align_ elements.
  int chunk_begin(uint32_t k, uint32_t chunks) const { return int(int64_t(units_) * k / chunks) * align_; }
  int chunk_end(uint32_t k, uint32_t chunks) const { return std::min(int(int64_t(units_) * (k + 1) / chunks) * align_, n_); }

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises parallel_for callers

  // The loop in progress, one word: bits 32-63 the loop's number, 16-31 its chunk count, 0-15 the
  // next chunk to claim. One fetch_add claims a chunk and says which loop it belongs to, so a
  // worker that wakes late can never take a chunk of a loop it has not seen published.
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> loop_{0};         // the loop's number again: the word workers sleep on
  std::atomic<uint32_t> done_{0};         // chunks finished: the word the caller sleeps on
  std::atomic<uint32_t> sleepers_{0};     // workers asleep (or about to be) on loop_
  std::atomic<uint32_t> caller_asleep_{0};
  std::atomic<bool> stop_{false};

  // The loop's arguments: written before its number is published, read only by a thread that
  // has claimed one of its chunks (the loop cannot end, nor these change, before that chunk does).
  const std::function<void(int, int)>* fn_ = nullptr;
  int n_ = 0;
  int align_ = 1;
  int units_ = 0;  // ceil(n / align)
  // Until then the caller runs every chunk itself (a recent loop stalled on a descheduled worker).
  std::chrono::steady_clock::time_point solo_until_{};
};

// The engine's shared pool; resized with set_thread_count (not while a loop runs).
ThreadPool& thread_pool();
// Threads set_thread_count takes at most (0: the default).
constexpr int kMaxThreads = 1024;
void set_thread_count(int n);

// What this process may really run on, and so the default thread count: the CPUs of its affinity
// mask, capped by its cgroup's CPU quota (rounded up to whole CPUs), at least 1.
struct ThreadBudget {
  int threads = 1;
  int affinity = 1;            // CPUs in sched_getaffinity's mask (hardware_concurrency where unknown)
  double cgroup_quota = 0;     // CPUs the quota allows (quota / period); 0: no quota
  std::string cgroup_file;     // the file the quota came from ("" when none)
};
// Computed once per process and kept. The cgroup files are read under $DKI_CGROUP_ROOT when it
// is set (a folder laid out like /sys/fs/cgroup; for tests), else under /sys/fs/cgroup.
const ThreadBudget& thread_budget();
int default_thread_count();

}  // namespace dki
