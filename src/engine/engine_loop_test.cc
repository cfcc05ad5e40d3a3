#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <map>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "engine/test_models.h"

namespace trellis {
namespace {

// Many threads submit at once; every request finishes exactly once with its tokens,
// equal to what the same greedy request produces alone (f32 weights: batching and the
// prefix cache change only float summation order, so greedy tokens are identical; see
// SchedulerTest.CacheOnEqualsCacheOffProperty).
TEST(EngineLoopTest, ConcurrentSubmittersAllFinish) {
  auto m = Model::Load(testing::WriteSmallModel("loop.gguf", "f32"));
  ASSERT_TRUE(m.ok());
  ThreadPool threads(2);
  SchedulerOptions o;
  o.block_size = 16;
  auto loop = EngineLoop::Start(**m, o, threads);
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();

  constexpr int kClients = 4, kPerClient = 5;
  auto make = [](int c, int i) {
    Request r;
    r.prompt = std::vector<int32_t>(30, 1 + c);  // 4 distinct shared prefixes
    r.prompt.push_back(100 + i);
    r.max_tokens = 5;
    r.sampling.temperature = 0;
    return r;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, RequestResult> done;
  std::vector<RequestResult> by_request(kClients * kPerClient);  // [c * kPerClient + i]
  std::vector<std::thread> clients;
  std::atomic<int> finished_twice{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kPerClient; ++i) {
        auto id = (*loop)->Submit(make(c, i), nullptr, [&, c, i](RequestId id, const RequestResult& res) {
          std::lock_guard<std::mutex> lock(mu);
          if (!done.emplace(id, res).second) finished_twice++;
          by_request[static_cast<size_t>(c * kPerClient + i)] = res;
          cv.notify_all();
        });
        ASSERT_TRUE(id.ok()) << id.status().ToString();
      }
    });
  }
  for (auto& t : clients) t.join();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done.size() == by_request.size(); }));
  }
  EXPECT_EQ(finished_twice.load(), 0);
  const SchedulerMetrics mt = (*loop)->metrics();
  EXPECT_EQ(mt.requests, kClients * kPerClient);
  EXPECT_GT(mt.cached_tokens, 0);  // clients sharing a prefix shared blocks
  loop->reset();  // stop the engine thread before the solo runs use the thread pool

  // Each request alone, on a fresh scheduler without the prefix cache.
  SchedulerOptions solo_o = o;
  solo_o.prefix_cache = false;
  for (int c = 0; c < kClients; ++c) {
    for (int i = 0; i < kPerClient; ++i) {
      const RequestResult& r = by_request[static_cast<size_t>(c * kPerClient + i)];
      EXPECT_EQ(r.reason, FinishReason::kLength);
      ASSERT_EQ(r.tokens.size(), 5u);
      auto solo = Scheduler::Create(**m, solo_o, threads);
      ASSERT_TRUE(solo.ok()) << solo.status().ToString();
      std::vector<int32_t> want;
      ASSERT_TRUE((*solo)->Submit(make(c, i), nullptr, [&](RequestId, const RequestResult& res) { want = res.tokens; }).ok());
      (*solo)->RunUntilIdle();
      ASSERT_EQ(want.size(), 5u);
      EXPECT_EQ(r.tokens, want) << "client " << c << " request " << i;
    }
  }
}

// Inspect runs on the engine thread between steps, idle or busy, and sees the tree fill.
TEST(EngineLoopTest, InspectRunsOnTheEngineThreadBetweenSteps) {
  auto m = Model::Load(testing::WriteSmallModel("loop-inspect.gguf", "f32"));
  ASSERT_TRUE(m.ok());
  ThreadPool threads(2);
  SchedulerOptions o;
  o.block_size = 16;
  auto loop = EngineLoop::Start(**m, o, threads);
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  auto nodes = std::make_shared<std::atomic<int>>(-1);
  auto on = std::make_shared<std::thread::id>();
  ASSERT_TRUE((*loop)->Inspect([nodes, on](Scheduler& s) {
    *nodes = s.cache().stats().n_nodes;
    *on = std::this_thread::get_id();
  }, std::chrono::seconds(5)));  // idle: the loop wakes for it
  EXPECT_EQ(nodes->load(), 0);
  EXPECT_NE(*on, std::this_thread::get_id());
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  Request r;
  r.prompt = std::vector<int32_t>(40, 3);
  r.max_tokens = 4;
  r.sampling.temperature = 0;
  ASSERT_TRUE((*loop)->Submit(r, nullptr, [&](RequestId, const RequestResult&) {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  }).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished; }));
  }
  ASSERT_TRUE((*loop)->Inspect([nodes](Scheduler& s) { *nodes = static_cast<int>(s.cache().Snapshot(100, 0).size()); },
                               std::chrono::seconds(5)));
  EXPECT_GE(nodes->load(), 1);  // the finished request's blocks are in the tree
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
