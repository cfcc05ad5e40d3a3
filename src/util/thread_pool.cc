#include "util/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trellis {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Spin iterations before a waiting thread sleeps. ~50 us at a few ns per pause: long
// enough to cover the gap between consecutive kernel jobs, short enough not to burn a
// core when the engine is idle.
constexpr int kSpinIterations = 20000;

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunImpl(JobFn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(ctx, 0, n_threads_);
  int spins = 0;
  while (true) {
    int p = pending_.load(std::memory_order_acquire);
    if (p == 0) break;
    if (++spins < kSpinIterations) {
      CpuRelax();
    } else {
      pending_.wait(p, std::memory_order_acquire);
    }
  }
}

void ThreadPool::WorkerLoop(int ith) {
  // Start from the initial generation, not a fresh load: a Run() may already have
  // bumped it before this thread got scheduled, and that job must not be missed.
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
    job_fn_(job_ctx_, ith, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace trellis
