#include "threadpool.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DKI_PAUSE() _mm_pause()
#else
#define DKI_PAUSE() ((void)0)
#endif

#ifdef __linux__
#include <linux/futex.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <condition_variable>
#endif

namespace dki {

namespace {

using Clock = std::chrono::steady_clock;

// How long a waiting thread keeps its core before it sleeps. Inside a token's forward pass the
// next loop follows the last within microseconds, so a worker spins through that gap; between
// tokens (sampling, the JS round trip) it sleeps. A caller's wait is for chunks already running,
// usually done in a few microseconds; a longer one means their thread lost its core, and
// sleeping gives that core back to it.
constexpr auto kWorkerSpin = std::chrono::microseconds(100);
constexpr auto kCallerSpin = std::chrono::microseconds(30);
// The first part of a spin only pauses (the event is usually that close); after it each round
// yields the core, so a thread we wait for that shares this core gets to run.
constexpr auto kPauseOnly = std::chrono::microseconds(2);
// Chunks per thread: enough that the running threads take over a stalled thread's share,
// few enough that per-chunk work (packing, transposing the input) stays a small part.
constexpr int kChunksPerThread = 4;

// A yield (or a few pauses) that took this long means another thread ran on this core: the core
// is contended, and a thread that keeps spinning there takes time from the one it waits for (or
// from the machine's other work). It sleeps instead, and a sleeper woken by the next loop gets
// the core sooner than a spinner that has used up its share.
constexpr auto kContended = std::chrono::microseconds(20);

// A caller that waited this long (and longer than its own chunks took, ×4) for chunks that other
// threads held: one of them was taken off its core mid-chunk, and the loop waited for the OS to
// give it back. With more runnable threads than cores this happens loop after loop (decode, ~200
// small loops a token, fell to 0.6× one thread under one busy process), so the caller then runs
// every chunk itself for kSolo, as one thread would, before it tries the workers again.
constexpr auto kStall = std::chrono::microseconds(200);
constexpr auto kSolo = std::chrono::milliseconds(50);

// Calls done() until it is true, `budget` has passed or the core proves contended; false: the
// caller should sleep.
template <class Done>
bool spin_until(const Done& done, Clock::duration budget) {
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  for (;;) {
    if (done()) return true;
    const Clock::time_point now = Clock::now();
    const Clock::duration spent = now - start;
    if (spent >= budget || now - last >= kContended) return false;
    last = now;
    if (spent < kPauseOnly) {
      for (int i = 0; i < 16; i++) DKI_PAUSE();
    } else {
      std::this_thread::yield();  // sched_yield on Linux
    }
  }
}

// Sleeping until a word changes: a futex on Linux (no system call when no one sleeps: callers
// keep their own count of sleepers), a condition variable elsewhere.
#ifdef __linux__
void sleep_while(std::atomic<uint32_t>& word, uint32_t value) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");
  while (word.load(std::memory_order_seq_cst) == value)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
}
void wake_all(std::atomic<uint32_t>& word) { syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0); }
#else
std::mutex g_sleep_mutex;
std::condition_variable g_sleep_cv;
void sleep_while(std::atomic<uint32_t>& word, uint32_t value) {
  std::unique_lock<std::mutex> lock(g_sleep_mutex);
  g_sleep_cv.wait(lock, [&] { return word.load() != value; });
}
void wake_all(std::atomic<uint32_t>&) {
  { std::lock_guard<std::mutex> lock(g_sleep_mutex); }  // a sleeper between its check and its wait holds the mutex
  g_sleep_cv.notify_all();
}
#endif

constexpr int kChunkBits = 16;
constexpr uint64_t kChunkMask = (uint64_t(1) << kChunkBits) - 1;
static_assert(kMaxThreads * kChunksPerThread + kMaxThreads < (1 << kChunkBits), "claims past the last chunk must not carry into the chunk count");

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; i++) workers_.emplace_back(&ThreadPool::worker, this);
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  loop_.fetch_add(1, std::memory_order_seq_cst);
  wake_all(loop_);
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    const uint64_t claim = claim_.fetch_add(1, std::memory_order_acq_rel);
    const uint32_t chunks = uint32_t((claim >> kChunkBits) & kChunkMask), k = uint32_t(claim & kChunkMask);
    if (k >= chunks) return;
    (*fn_)(chunk_begin(k, chunks), chunk_end(k, chunks));
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == chunks && caller_asleep_.load(std::memory_order_seq_cst)) wake_all(done_);
  }
}

void ThreadPool::worker() {
  uint32_t seen = 0;  // the pool's first loop is number 1
  for (;;) {
    const auto published = [&] { return loop_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(published, kWorkerSpin)) {
      // Counted before the last look at loop_ (both seq_cst): a caller that publishes after that
      // look sees the count and wakes us; one that published before, we see.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      sleep_while(loop_, seen);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = loop_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    run_chunks();
  }
}

void ThreadPool::parallel_for(int n, int align, const std::function<void(int, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n <= align) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  align_ = align < 1 ? 1 : align;
  units_ = int((int64_t(n) + align_ - 1) / align_);
  n_ = n;
  fn_ = &fn;
  const uint32_t chunks = uint32_t(std::min(units_, n_threads_ * kChunksPerThread));
  const Clock::time_point start = Clock::now();
  if (start < solo_until_) {
    // The same chunks in order, so the same bits as with the workers.
    for (uint32_t k = 0; k < chunks; k++) fn(chunk_begin(k, chunks), chunk_end(k, chunks));
    fn_ = nullptr;
    return;
  }
  done_.store(0, std::memory_order_relaxed);
  caller_asleep_.store(0, std::memory_order_relaxed);
  const uint32_t loop = loop_.load(std::memory_order_relaxed) + 1;
  claim_.store(uint64_t(loop) << 32 | uint64_t(chunks) << kChunkBits, std::memory_order_release);
  loop_.store(loop, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_all(loop_);

  run_chunks();
  // The chunks other threads claimed: spin while they are likely running, then sleep.
  const Clock::time_point ran = Clock::now();
  const auto finished = [&] { return done_.load(std::memory_order_acquire) == chunks; };
  if (!spin_until(finished, kCallerSpin)) {
    caller_asleep_.store(1, std::memory_order_seq_cst);
    for (uint32_t d; (d = done_.load(std::memory_order_seq_cst)) != chunks;) sleep_while(done_, d);
  }
  const Clock::time_point end = Clock::now();
  if (end - ran > kStall && end - ran > 4 * (ran - start)) solo_until_ = end + kSolo;
  fn_ = nullptr;
}

// ---------------------------------------------------------------- the default thread count

namespace {

#ifdef __linux__
std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// CPUs a cgroup v2 cpu.max ("QUOTA PERIOD", or "max PERIOD": no quota) allows; 0 for none or unreadable.
double parse_cpu_max(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || !(period > 0)) return 0;
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  return *end == '\0' && q > 0 ? q / period : 0;
}

// The same from cgroup v1's cpu.cfs_quota_us (-1: no quota) and cpu.cfs_period_us.
double parse_cfs(const std::string& quota_text, const std::string& period_text) {
  double quota = 0, period = 0;
  if (!(std::istringstream(quota_text) >> quota) || !(std::istringstream(period_text) >> period)) return 0;
  return quota > 0 && period > 0 ? quota / period : 0;
}

// The process's cgroup path from /proc/self/cgroup's "ID:CONTROLLERS:PATH" lines: v2's "0::PATH"
// (v1 false), or the v1 line whose controllers include "cpu". "/" when there is none.
std::string cgroup_path(bool v1) {
  std::istringstream lines(read_file("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    bool match = !v1 && line.compare(0, a, "0") == 0 && controllers.empty();
    if (v1) {
      std::istringstream names(controllers);
      for (std::string c; std::getline(names, c, ',');) match |= c == "cpu";
    }
    if (match) return line.substr(b + 1);
  }
  return "/";
}

// Lowers b's quota to the tightest one from the process's cgroup up to the root of the hierarchy
// mounted at `mount` (a limit on a parent binds its children). A path that is not there (another
// cgroup namespace) starts at the root. quota(dir) reads a folder's quota in CPUs, 0 for none,
// from its file `name`.
template <class Quota>
void tightest_quota(const std::string& mount, std::string path, const char* name, const Quota& quota, ThreadBudget& b) {
  if (path.empty() || path[0] != '/' || !exists(mount + path)) path = "/";
  for (;;) {
    const std::string dir = mount + (path == "/" ? "" : path);
    const double q = quota(dir);
    if (q > 0 && (b.cgroup_quota == 0 || q < b.cgroup_quota)) {
      b.cgroup_quota = q;
      b.cgroup_file = dir + "/" + name;
    }
    if (path == "/") return;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
}
#endif

ThreadBudget compute_budget() {
  ThreadBudget b;
  const unsigned hw = std::thread::hardware_concurrency();
  b.affinity = hw == 0 ? 1 : int(hw);
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) b.affinity = CPU_COUNT(&set);
  const char* env = std::getenv("DKI_CGROUP_ROOT");
  const std::string root = env && *env ? env : "/sys/fs/cgroup";
  // cgroup v2: the unified hierarchy is the root itself, or root/unified on a hybrid setup.
  const std::string v2 = exists(root + "/cgroup.controllers") ? root : root + "/unified";
  tightest_quota(v2, cgroup_path(false), "cpu.max", [](const std::string& dir) { return parse_cpu_max(read_file(dir + "/cpu.max")); }, b);
  // cgroup v1: the cpu controller's own mount.
  for (const char* name : {"cpu", "cpu,cpuacct", "cpuacct,cpu"}) {
    const std::string mount = root + "/" + name;
    if (!exists(mount + "/cpu.cfs_quota_us")) continue;
    tightest_quota(mount, cgroup_path(true), "cpu.cfs_quota_us", [](const std::string& dir) {
      return parse_cfs(read_file(dir + "/cpu.cfs_quota_us"), read_file(dir + "/cpu.cfs_period_us"));
    }, b);
    break;
  }
#endif
  b.threads = b.affinity;
  // A quota of 1.5 CPUs gets 2 threads: with chunks claimed one at a time the second thread
  // does whatever share of the work its time allows.
  if (b.cgroup_quota > 0) b.threads = std::min(b.threads, int(std::ceil(b.cgroup_quota - 1e-9)));
  b.threads = std::max(1, std::min(b.threads, kMaxThreads));
  return b;
}

std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;

}  // namespace

const ThreadBudget& thread_budget() {
  static const ThreadBudget budget = compute_budget();
  return budget;
}

int default_thread_count() { return thread_budget().threads; }

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
