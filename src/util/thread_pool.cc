#include "util/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trellis {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

// Spin iterations before an idle worker sleeps: long enough to bridge the serial gap
// between consecutive kernel jobs, short enough not to burn a core when idle.
constexpr int kSpinIterations = 20000;

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunSlices() {
  int s;
  while ((s = next_slice_.fetch_add(1, std::memory_order_relaxed)) < n_threads_) job_fn_(job_ctx_, s, n_threads_);
}

void ThreadPool::RunImpl(JobFn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  next_slice_.store(0, std::memory_order_relaxed);
  const uint32_t gen = ++last_generation_;
  // Open the job (no active workers), then wake the workers.
  state_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  generation_.store(gen, std::memory_order_release);
  generation_.notify_all();

  RunSlices();

  // Close the door: workers that have not joined yet will skip this job. Then wait for
  // those inside to finish their slices (they are running, so spin, then yield).
  uint64_t s = state_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
  int spins = 0;
  while ((s & kActiveMask) != 0) {
    if (++spins < kSpinIterations) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop() {
  // Start from the initial generation, not a fresh load: a Run() may already have
  // published a job before this thread got scheduled, and it must still see it.
  uint32_t seen = 0;
  while (true) {
    int spins = 0;
    uint32_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        CpuRelax();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the job if it is still open: same generation, not closed.
    uint64_t s = state_.load(std::memory_order_acquire);
    bool joined = false;
    while ((s >> 32) == g && (s & kClosed) == 0) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    RunSlices();
    state_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace trellis
