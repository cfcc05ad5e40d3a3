#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace trellis {
namespace {

TEST(ThreadPoolTest, EveryThreadRunsOncePerJob) {
  for (int n : {1, 2, 4}) {
    ThreadPool pool(n);
    for (int job = 0; job < 2000; ++job) {
      std::vector<int> hits(n, 0);
      pool.Run([&](int ith, int nth) {
        ASSERT_EQ(nth, n);
        hits[ith]++;
      });
      for (int h : hits) ASSERT_EQ(h, 1);
    }
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> seen(n);
    pool.ParallelFor(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) seen[i]++;
    });
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
  }
}

}  // namespace
}  // namespace trellis
