// ThreadPool: a fixed team of threads that run one data-parallel job at a time.
//
// Run(f) calls f(ith, nth) once on each of the nth threads (the caller is thread 0)
// and returns when all have finished. Built for kernels: a job per matmul or layer,
// thousands per second, so workers spin briefly on an atomic generation counter
// before they sleep, and Run() performs no heap allocation.
//
// Thread safety: Run() must be called from one thread at a time (the engine thread).
// Jobs must not call Run() recursively.
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

  // Splits [0, n) into nth contiguous ranges; calls f(begin, end, ith) on each thread.
  template <typename F>
  void ParallelFor(int64_t n, F&& f) {
    Run([&](int ith, int nth) {
      const int64_t begin = n * ith / nth;
      const int64_t end = n * (ith + 1) / nth;
      if (begin < end) f(begin, end, ith);
    });
  }

 private:
  using JobFn = void (*)(void*, int, int);
  void RunImpl(JobFn fn, void* ctx);
  void WorkerLoop(int ith);

  const int n_threads_;
  std::vector<std::thread> workers_;
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<bool> stop_{false};
};

}  // namespace trellis
