#include "threadpool.h"

#include <memory>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DKI_PAUSE() _mm_pause()
#else
#define DKI_PAUSE() std::this_thread::yield()
#endif

namespace dki {

namespace {
constexpr int kSpinIterations = 20000;  // ~50-100 µs before a worker goes to sleep
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; i++) workers_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  // Split [0, n) into n_threads_ chunks whose boundaries are multiples of align_.
  int units = (n_ + align_ - 1) / align_;
  int begin = int(int64_t(units) * index / n_threads_) * align_;
  int end = int(int64_t(units) * (index + 1) / n_threads_) * align_;
  if (end > n_) end = n_;
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      DKI_PAUSE();
      spins++;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    run_chunk(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int n, int align, const std::function<void(int, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n <= align) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  fn_ = &fn;
  n_ = n;
  align_ = align < 1 ? 1 : align;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_chunk(0);
  // Wait for the workers: spin first (they usually finish together with us), then sleep.
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0 && spins < kSpinIterations) {
    DKI_PAUSE();
    spins++;
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_.load() == 0; });
  }
  fn_ = nullptr;
}

namespace {
std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;
}  // namespace

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

ThreadPool& thread_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(default_thread_count());
  return *g_pool;
}

void set_thread_count(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (n < 1) n = default_thread_count();
  if (g_pool && g_pool->size() == n) return;
  g_pool = std::make_unique<ThreadPool>(n);
}

}  // namespace dki
