#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <map>
#include <thread>

#include "engine/test_models.h"

namespace trellis {
namespace {

// Many threads submit at once; every request finishes exactly once with its tokens,
// equal to what the same greedy request produces alone.
TEST(EngineLoopTest, ConcurrentSubmittersAllFinish) {
  auto m = Model::Load(testing::WriteSmallModel("loop.gguf", "q4_0"));
  ASSERT_TRUE(m.ok());
  ThreadPool threads(2);
  SchedulerOptions o;
  o.block_size = 16;
  auto loop = EngineLoop::Start(**m, o, threads);
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();

  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, RequestResult> done;
  std::vector<std::thread> clients;
  std::atomic<int> finished_twice{0};
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 5; ++i) {
        Request r;
        r.prompt = std::vector<int32_t>(30, 1 + c);  // 4 distinct shared prefixes
        r.prompt.push_back(100 + i);
        r.max_tokens = 5;
        r.sampling.temperature = 0;
        auto id = (*loop)->Submit(std::move(r), nullptr, [&](RequestId id, const RequestResult& res) {
          std::lock_guard<std::mutex> lock(mu);
          if (!done.emplace(id, res).second) finished_twice++;
          cv.notify_all();
        });
        ASSERT_TRUE(id.ok()) << id.status().ToString();
      }
    });
  }
  for (auto& t : clients) t.join();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done.size() == 20; }));
  EXPECT_EQ(finished_twice.load(), 0);
  for (const auto& [id, r] : done) {
    EXPECT_EQ(r.reason, FinishReason::kLength);
    EXPECT_EQ(r.tokens.size(), 5u);
  }
  const SchedulerMetrics mt = (*loop)->metrics();
  EXPECT_EQ(mt.requests, 20);
  EXPECT_GT(mt.cached_tokens, 0);  // clients sharing a prefix shared blocks
}

TEST(EngineLoopTest, ValidationErrorsAreImmediateAndQueueIsBounded) {
  auto m = Model::Load(testing::WriteSmallModel("loop2.gguf", "q4_0"));
  ASSERT_TRUE(m.ok());
  ThreadPool threads(2);
  auto loop = EngineLoop::Start(**m, SchedulerOptions{.n_ctx = 256, .max_running = 1}, threads, /*max_queue=*/2);
  ASSERT_TRUE(loop.ok());
  Request bad;
  EXPECT_EQ((*loop)->Submit(bad, nullptr, nullptr).status().code(), StatusCode::kInvalidArgument);
  int full = 0;
  for (int i = 0; i < 20; ++i) {
    Request r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 200;
    auto id = (*loop)->Submit(r, nullptr, nullptr);
    if (!id.ok()) {
      EXPECT_EQ(id.status().code(), StatusCode::kResourceExhausted);
      ++full;
    }
  }
  EXPECT_GT(full, 0);
}

TEST(EngineLoopTest, ShutdownCancelsInFlightRequests) {
  auto m = Model::Load(testing::WriteSmallModel("loop3.gguf", "q4_0"));
  ASSERT_TRUE(m.ok());
  ThreadPool threads(2);
  std::atomic<int> cancelled{0};
  std::atomic<int> tokens{0};
  {
    auto loop = EngineLoop::Start(**m, SchedulerOptions{.n_ctx = 8192}, threads);
    ASSERT_TRUE(loop.ok());
    for (int i = 0; i < 3; ++i) {
      Request r;
      r.prompt = {1, 2, 3};
      r.max_tokens = 8000;
      ASSERT_TRUE((*loop)->Submit(r, [&](RequestId, int32_t, std::span<const float>) { tokens++; },
                                  [&](RequestId, const RequestResult& res) {
                                    if (res.reason == FinishReason::kCancelled) cancelled++;
                                  }).ok());
    }
    // Shut down once all three are decoding (a fixed sleep raced the faster kernels: three
    // 400-token requests on the small model finished within 50 ms).
    while (tokens.load() < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(cancelled.load(), 3);
}

}  // namespace
}  // namespace trellis
