// A fixed pool of worker threads for data-parallel loops. The caller thread takes a share of
// every loop. Workers spin briefly after a job (the next matmul of a token follows within
// microseconds), then sleep on a condition variable, so an idle engine uses no CPU.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dki {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();

  int size() const { return n_threads_; }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread (chunk
  // boundaries are multiples of `align`). Blocks until all chunks finish. Only one loop runs
  // at a time: concurrent callers are serialised.
  void parallel_for(int n, int align, const std::function<void(int, int)>& fn);

 private:
  void worker(int index);
  void run_chunk(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises parallel_for callers

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;

  // The current job.
  const std::function<void(int, int)>* fn_ = nullptr;
  int n_ = 0;
  int align_ = 1;
};

// The engine's shared pool; resized with set_thread_count (not while a loop runs).
ThreadPool& thread_pool();
// Threads set_thread_count takes at most (0: all cores).
constexpr int kMaxThreads = 1024;
void set_thread_count(int n);
int default_thread_count();

}  // namespace dki
