#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "util/slowdown.h"

namespace trellis {
namespace {

TEST(ThreadPoolTest, EverySliceRunsExactlyOncePerJob) {
  for (int n : {1, 2, 4}) {
    ThreadPool pool(n);
    for (int job = 0; job < 5000; ++job) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.Run([&](int ith, int nth) {
        ASSERT_EQ(nth, n);
        hits[static_cast<size_t>(ith)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    pool.ParallelFor(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
    });
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
  }
}

// Slices run concurrently when workers are available: two slices that each wait for
// the other to start can both finish (bounded, so a pool that serializes fails fast
// instead of hanging).
TEST(ThreadPoolTest, SlicesRunConcurrentlyWhenWorkersAreFree) {
  ThreadPool pool(2);
  int concurrent_jobs = 0;
  for (int job = 0; job < 50; ++job) {
    std::atomic<int> started{0};
    std::atomic<bool> both{false};
    pool.Run([&](int, int) {
      started++;
      const auto deadline = std::chrono::steady_clock::now() + TestScaled(std::chrono::milliseconds(50));
      while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      if (started.load() == 2) both = true;
    });
    concurrent_jobs += both.load();
  }
  EXPECT_GT(concurrent_jobs, 0);
}

// Thousands of tiny jobs with more threads than cores (workers are often descheduled):
// every slice still runs exactly once and nothing stalls.
TEST(ThreadPoolTest, ManyTinyJobsComplete) {
  ThreadPool pool(4);  // more threads than cores here: workers are often descheduled
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job) {
    pool.Run([&](int ith, int) { sum += ith; });
  }
  EXPECT_EQ(sum.load(), 20000 * (0 + 1 + 2 + 3));
}

}  // namespace
}  // namespace trellis
