// ThreadPool: a fixed team of threads that run one data-parallel job at a time.
//
// Run(f) calls f(ith, nth) exactly once for every slice ith in [0, nth) and returns
// when all slices are done. Slices are claimed dynamically: the caller works through
// them itself, and each worker that wakes in time claims what is left. The caller
// never waits for a worker that has not claimed a slice, so a descheduled worker (a
// busy laptop, more threads than free cores) costs nothing but its share of speed-up,
// instead of stalling every kernel until the OS runs it again.
//
// Built for kernels: a job per matmul or layer, thousands per second, so workers spin
// briefly on an atomic generation before they sleep, and Run() does not allocate.
//
// Contract for jobs: a slice must not wait for another slice (no barriers inside a
// job), and must use only state indexed by ith (never by "which OS thread am I"), since
// one thread may run several slices one after another.
//
// Thread safety: Run() must be called from one thread at a time. Jobs must not call
// Run() on the same pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace trellis {

class ThreadPool {
 public:
  // n_threads >= 1; n_threads - 1 worker threads are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  template <typename F>
  void Run(F&& f) {
    using Fn = std::remove_reference_t<F>;
    RunImpl([](void* ctx, int ith, int nth) { (*static_cast<Fn*>(ctx))(ith, nth); },
            const_cast<void*>(static_cast<const void*>(&f)));
  }

  // Splits [0, n) into nth contiguous ranges; calls f(begin, end, ith) for each non-empty one.
  template <typename F>
  void ParallelFor(int64_t n, F&& f) {
    if (n <= 0) return;
    Run([&](int ith, int nth) {
      const int64_t begin = n * ith / nth;
      const int64_t end = n * (ith + 1) / nth;
      if (begin < end) f(begin, end, ith);
    });
  }

 private:
  using JobFn = void (*)(void*, int, int);
  void RunImpl(JobFn fn, void* ctx);
  void RunSlices();
  void WorkerLoop();

  // state_ packs the current job's generation (high 32 bits), a "closed" bit (no more
  // workers may join) and the number of workers inside the job (low 31 bits).
  static constexpr uint64_t kClosed = uint64_t{1} << 31;
  static constexpr uint64_t kActiveMask = kClosed - 1;

  const int n_threads_;
  std::vector<std::thread> workers_;
  JobFn job_fn_ = nullptr;  // written by the caller before the job is published
  void* job_ctx_ = nullptr;
  uint32_t last_generation_ = 0;  // caller-side copy
  alignas(64) std::atomic<uint32_t> generation_{0};  // futex word workers sleep on
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int> next_slice_{0};
  alignas(64) std::atomic<bool> stop_{false};
};

}  // namespace trellis
