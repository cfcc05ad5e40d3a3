// Scheduler: continuous batching over the shared prefix cache. The central property:
// with greedy sampling a request's tokens and logits are the same whether its prefix
// came from the cache or was computed, and whatever else shares its batches.
// The replacement operator new below pairs with free(); GCC cannot see that.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <random>

#include "engine/run_one.h"
#include "engine/test_models.h"
#include "engine/test_scheduler.h"
#include "util/slowdown.h"

// Counts heap allocations in this test binary (for the zero-allocation decode check).
namespace {
std::atomic<int64_t> g_allocs{0};
}
void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow forms too, or the library's nothrow new (std::stable_sort's buffer) would be
// released by the free()-based delete below: an alloc-dealloc mismatch under ASan.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace trellis {
namespace {

using testing::Greedy;
using testing::Outcome;
using testing::RunAll;

const Model& SmallModel(const std::string& type) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto& m = models[type];
  if (!m) {
    auto r = Model::Load(testing::WriteSmallModel("sched_" + type + ".gguf", type));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    m = std::move(r).value();
  }
  return *m;
}

TEST(SchedulerTest, MaxRelDiffFailsOnNanAndInf) {
  std::vector<float> ref(64), ours;
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<float>(i % 7) - 3.f;
  EXPECT_EQ(testing::MaxRelDiff(ref, ref), 0.0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    ours = ref;
    ours[10] = bad;
    EXPECT_FALSE(testing::MaxRelDiff(ours, ref) < 1e-4) << bad;
    EXPECT_FALSE(testing::MaxRelDiff(ref, ours) < 1e-4) << bad;
  }
  ours.assign(ref.size(), std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(testing::MaxRelDiff(ours, ref) < 1e-4);
}

std::unique_ptr<Scheduler> MakeScheduler(const Model& m, ThreadPool& pool, SchedulerOptions o) {
  auto s = Scheduler::Create(m, o, pool);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

// Every request's output equals the output of the same request run alone, without the
// cache. f32 weights: the only differences allowed are float summation order (the
// cached K/V were computed in another batch composition), bound 1e-4 of the logits'
// spread on every step, and identical tokens.
TEST(SchedulerTest, CacheOnEqualsCacheOffProperty) {
  const Model& m = SmallModel("f32");
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (int round = 0; round < (TestEmulated() ? 2 : 6); ++round) {  // slowdown.h
    const int bs = std::vector<int>{8, 16, 32}[static_cast<size_t>(round % 3)];
    SchedulerOptions on;
    on.block_size = bs;
    on.max_batch_tokens = std::vector<int>{64, 128, 512}[static_cast<size_t>(rng() % 3)];
    on.prefill_chunk = std::vector<int>{16, 48, 512}[static_cast<size_t>(rng() % 3)];
    on.kv_blocks = 200;
    on.n_ctx = 512;
    // A few shared "system prompts", each request = one of them + its own suffix.
    std::vector<std::vector<int32_t>> systems(3);
    for (auto& sys : systems) {
      sys.resize(static_cast<size_t>(10 + rng() % 90));
      for (auto& t : sys) t = static_cast<int32_t>(rng() % 1000) + 3;
    }
    std::vector<Request> reqs;
    const int n_req = 4 + static_cast<int>(rng() % 5);
    for (int i = 0; i < n_req; ++i) {
      std::vector<int32_t> p = systems[rng() % systems.size()];
      const int suffix = static_cast<int>(rng() % 40);
      for (int k = 0; k < suffix; ++k) p.push_back(static_cast<int32_t>(rng() % 1000) + 3);
      if (p.empty()) p.push_back(1);
      reqs.push_back(Greedy(p, 1 + static_cast<int>(rng() % 12)));
    }
    // Warm part of the cache first, then everything concurrently.
    auto sched = MakeScheduler(m, pool, on);
    RunAll(*sched, {reqs[0]});
    auto together = RunAll(*sched, reqs);
    const SchedulerMetrics mt = sched->metrics();
    EXPECT_GT(mt.cached_tokens, 0) << "round " << round;
    EXPECT_EQ(mt.running + mt.waiting, 0);
    EXPECT_EQ(sched->cache().CheckInvariants(), "");

    SchedulerOptions off = on;
    off.prefix_cache = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto solo_s = MakeScheduler(m, pool, off);
      auto solo = RunAll(*solo_s, {reqs[i]});
      ASSERT_EQ(together[i].tokens, solo[0].tokens) << "round " << round << " request " << i;
      ASSERT_EQ(together[i].logits.size(), solo[0].logits.size());
      for (size_t k = 0; k < solo[0].logits.size(); ++k) {
        EXPECT_LT(testing::MaxRelDiff(together[i].logits[k], solo[0].logits[k]), 1e-4)
            << "round " << round << " request " << i << " step " << k;
      }
      EXPECT_EQ(solo_s->pool().n_used(), 0);
    }
  }
}

TEST(SchedulerTest, SecondSessionAcquiresTheSharedPrefix) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 16;
  auto s = MakeScheduler(m, pool, o);
  std::vector<int32_t> sys(100);
  for (int i = 0; i < 100; ++i) sys[static_cast<size_t>(i)] = 10 + i;
  auto a = sys, b = sys;
  a.insert(a.end(), {500, 501, 502});
  b.insert(b.end(), {600, 601});
  auto r1 = RunAll(*s, {Greedy(a, 4)});
  EXPECT_EQ(r1[0].result.n_cached, 0);
  const SchedulerMetrics m1 = s->metrics();
  auto r2 = RunAll(*s, {Greedy(b, 4)});
  // 6 whole blocks of the 100 shared tokens, then the first 4 slots of a's 7th block
  // (a's last, partly filled block, cached when a finished), copied into b's own.
  EXPECT_EQ(r2[0].result.n_cached, 100);
  const SchedulerMetrics m2 = s->metrics();
  EXPECT_EQ(m2.blocks_acquired - m1.blocks_acquired, 6);
  EXPECT_EQ(m2.blocks_allocated - m1.blocks_allocated, 1);  // 102 tokens + 4: block 7 only (the copy)
  EXPECT_EQ(m2.partial_copies - m1.partial_copies, 1);
  EXPECT_EQ(m2.cached_tokens, 100);
  EXPECT_NEAR(m2.HitRate(), 100.0 / 205.0, 1e-9);
}

// The metrics on a workload small enough to count by hand (block size 4; the pool is
// large enough that nothing is evicted or preempted). S = 10 shared tokens s0..s9.
//   A = S + 2 own tokens (12), max_tokens 6, alone on an empty cache. Admission allocates
//     ceil(12/4) = 3 blocks. Prefill computes 12 positions and samples token 1; tokens 2..6
//     each need the previous one run through the model, so decode computes positions
//     12..16 (5 tokens) and allocates blocks 3 and 4 on the way (2 on the decode path).
//     Blocks 0..3 (positions 0..15) are full and enter the tree as they fill; at the finish
//     block 4 (position 16 only) enters it too, as a partly filled block.
//   B = S + 1 (11), max 5, and C = S + 3 (13), max 4, submitted together. Both match
//     blocks 0 and 1 (s0..s7) whole; block 2 holds s8 s9 and A's own tokens: its first 2
//     slots match, and are copied into a block of their own (reuse to the token).
//     B acquires 2, allocates ceil(11/4) - 2 = 1 (the copy), prefills position 10 (1),
//     decodes 11..14 (4), which needs one more block on the decode path.
//     C acquires 2, allocates ceil(13/4) - 2 = 2 (the first is the copy), prefills 10..12
//     (3), decodes 13..15 (3) inside its last block: none more.
// blocks_allocated = (3 + 2) + (1 + 1) + 2 = 9 (counting only admission gave 6);
// blocks_acquired = 2 + 2 = 4; cached_tokens = 10 + 10 = 20 (4 of them copied); prompt
// tokens computed = 12 + 1 + 3 = 16 = 36 prompt tokens - 20 cached; computed_tokens =
// 16 + 5 + 4 + 3 = 28, i.e. prompt computed + (generated - 1) per request, as
// `bench prefix` derives it.
// Left in the pool: every block, all in the tree: A's 4 full and its partial one, B's
// 2 full... (its copy, full by the end, and its partial last), C's 2 full = 9.
TEST(SchedulerTest, CountersMatchAHandCountedWorkload) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  auto s = MakeScheduler(m, pool, SchedulerOptions{.block_size = 4, .kv_blocks = 32});
  std::vector<int32_t> sys(10);
  for (int i = 0; i < 10; ++i) sys[static_cast<size_t>(i)] = 20 + i;
  auto a = sys, b = sys, c = sys;
  a.insert(a.end(), {100, 101});
  b.insert(b.end(), {200});
  c.insert(c.end(), {300, 301, 302});
  const auto ra = RunAll(*s, {Greedy(a, 6, false)});
  const SchedulerMetrics ma = s->metrics();
  EXPECT_EQ(ma.blocks_allocated, 5);
  EXPECT_EQ(ma.computed_tokens, 17);
  const auto rbc = RunAll(*s, {Greedy(b, 5, false), Greedy(c, 4, false)});
  const SchedulerMetrics mt = s->metrics();

  EXPECT_EQ(mt.blocks_allocated, 9);
  EXPECT_EQ(mt.blocks_acquired, 4);
  EXPECT_EQ(mt.cached_tokens, 20);
  EXPECT_EQ(mt.partial_copies, 2);
  EXPECT_EQ(mt.partial_tokens, 4);
  EXPECT_EQ(mt.prompt_tokens, 36);
  EXPECT_EQ(mt.computed_tokens, 28);
  EXPECT_EQ(mt.generated_tokens, 15);
  EXPECT_EQ(mt.evicted_blocks, 0);
  EXPECT_EQ(mt.preemptions, 0);
  ASSERT_EQ(ra[0].tokens.size(), 6u);
  ASSERT_EQ(rbc[0].tokens.size(), 5u);
  ASSERT_EQ(rbc[1].tokens.size(), 4u);
  EXPECT_EQ(ra[0].result.n_cached, 0);
  EXPECT_EQ(rbc[0].result.n_cached, 10);
  EXPECT_EQ(rbc[1].result.n_cached, 10);
  // The bench's prompt-token figure, both ways.
  int64_t prompt_computed = 0, decode = 0;
  for (const Outcome* o : {&ra[0], &rbc[0], &rbc[1]}) {
    prompt_computed += o->result.n_prompt - o->result.n_cached;
    decode += static_cast<int64_t>(o->result.tokens.size()) - 1;
  }
  EXPECT_EQ(prompt_computed, 16);
  EXPECT_EQ(mt.computed_tokens - decode, 16);
  EXPECT_EQ(s->pool().n_used(), 9);
  EXPECT_EQ(s->cache().stats().n_cached_blocks, 9);
  EXPECT_EQ(s->cache().CheckInvariants(), "");
}

// Requests arriving together with a shared prefix compute it once: the later ones wait
// for the first one's blocks to reach the tree instead of computing them in parallel.
TEST(SchedulerTest, ConcurrentArrivalsComputeASharedPrefixOnce) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 16;
  o.prefill_chunk = 32;  // the shared prefix takes several steps
  auto s = MakeScheduler(m, pool, o);
  std::vector<int32_t> sys(96);
  for (int i = 0; i < 96; ++i) sys[static_cast<size_t>(i)] = 20 + i;
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    auto p = sys;
    for (int k = 0; k < 10; ++k) p.push_back(300 + 10 * i + k);
    reqs.push_back(Greedy(p, 3, false));
  }
  auto out = RunAll(*s, reqs);
  const SchedulerMetrics mt = s->metrics();
  EXPECT_EQ(mt.cached_tokens, 7 * 96);
  EXPECT_EQ(mt.computed_tokens, 96 + 8 * 10 + 8 * 2);  // prefix once, suffixes, decode steps
  for (const auto& o2 : out) EXPECT_EQ(o2.tokens.size(), 3u);
}

TEST(SchedulerTest, DifferentSaltsShareNothing) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  auto s = MakeScheduler(m, pool, SchedulerOptions{.block_size = 16});
  std::vector<int32_t> p(80, 42);
  Request a = Greedy(p, 2), b = Greedy(p, 2), c = Greedy(p, 2);
  a.cache_salt = 1;
  b.cache_salt = 2;
  c.cache_salt = 1;
  EXPECT_EQ(RunAll(*s, {a})[0].result.n_cached, 0);
  EXPECT_EQ(RunAll(*s, {b})[0].result.n_cached, 0);
  // 4 whole blocks and 15 slots of the fifth: all but the last position, which is
  // always computed.
  EXPECT_EQ(RunAll(*s, {c})[0].result.n_cached, 79);
}

// Reuse to the token, against the same requests without the cache (f32: only summation
// order may differ). A warm prompt P, then prompts that end at every offset inside P's
// blocks, prompts that continue P past a block boundary, and the continuation of a
// finished session (P + its reply + more): each must reuse every cached position but the
// last, and give the logits and tokens of a cold run.
// Prompts that leave a cached prompt P (`warm`) inside a block, so the shared part is
// reused to the token, then P's next turn (P, the reply the first session generated, more):
// each request with the tokens it should find cached and a name.
struct ReuseCase {
  Request req;
  int cached;
  std::string what;
};
std::vector<ReuseCase> DivergingAndNextTurn(const std::vector<int32_t>& warm, const std::vector<int32_t>& reply,
                                            int next_turn_tokens) {
  std::vector<ReuseCase> v;
  for (int cut : {9, 15, 20, 33}) {
    std::vector<int32_t> p(warm.begin(), warm.begin() + cut);
    p.push_back(999);
    p.push_back(998);
    v.push_back({Greedy(p, 3), cut, "diverging after " + std::to_string(cut)});
  }
  // Everything the first session computed (all of P and its reply but the last token).
  std::vector<int32_t> turn2 = warm;
  turn2.insert(turn2.end(), reply.begin(), reply.end());
  for (int t : {11, 12, 13}) turn2.push_back(t);
  v.push_back({Greedy(turn2, next_turn_tokens), static_cast<int>(warm.size() + reply.size()) - 1, "second turn"});
  return v;
}

TEST(SchedulerTest, ReuseToTheTokenEqualsCacheOff) {
  const Model& m = SmallModel("f32");
  ThreadPool pool(2);
  SchedulerOptions on;
  on.block_size = 8;
  on.kv_blocks = 256;
  on.n_ctx = 256;
  SchedulerOptions off = on;
  off.prefix_cache = false;
  std::mt19937 rng(5);
  std::vector<int32_t> warm(37);
  for (auto& t : warm) t = static_cast<int32_t>(rng() % 1000) + 3;

  // (ASSERT_* needs a void function: the outcome goes to *out.)
  auto check = [&](Scheduler& s, const Request& r, int expect_cached, const std::string& what, Outcome* out = nullptr) {
    auto hot = RunAll(s, {r});
    if (out) *out = hot[0];
    EXPECT_EQ(hot[0].result.n_cached, expect_cached) << what;
    auto cold_s = MakeScheduler(m, pool, off);
    auto cold = RunAll(*cold_s, {r});
    ASSERT_EQ(hot[0].tokens, cold[0].tokens) << what;
    ASSERT_EQ(hot[0].logits.size(), cold[0].logits.size()) << what;
    for (size_t k = 0; k < cold[0].logits.size(); ++k) {
      EXPECT_LT(testing::MaxRelDiff(hot[0].logits[k], cold[0].logits[k]), 1e-4) << what << " step " << k;
    }
    EXPECT_EQ(s.cache().CheckInvariants(), "") << what;
  };

  auto s = MakeScheduler(m, pool, on);
  Outcome first;
  check(*s, Greedy(warm, 6), 0, "warm", &first);
  // Prompts that stop inside P: all but the last position come from the cache, whole
  // blocks shared, the rest copied from the block the prompt ends in.
  for (int len = 2; len <= 37; len += 5) {
    std::vector<int32_t> p(warm.begin(), warm.begin() + len);
    check(*s, Greedy(p, 3), len - 1, "prefix of " + std::to_string(len));
  }
  for (const ReuseCase& c : DivergingAndNextTurn(warm, first.tokens, 4)) check(*s, c.req, c.cached, c.what);
  const SchedulerMetrics mt = s->metrics();
  EXPECT_GT(mt.partial_copies, 0);
  EXPECT_EQ(mt.running + mt.waiting, 0);
}

// Quantized K/V (q8_0, q4_0, and mixed with f16) through the whole scheduler: reuse to
// the token (whole blocks shared, partial blocks copied row by row) gives what a cold
// run gives; the type takes effect (other logits than f16's, near them); the same
// --kv-memory holds ~1.9x (q8_0) and ~3.6x (q4_0) the blocks. Quantizing is per row, so
// only a K/V element whose f32 value moved by a rounding step between batch shapes can
// land on another code: bound 0.03 of the logits' spread (as for quantized weights,
// InvarianceBound in engine_test.cc); a wrong layout or dequantization gives ~1.
TEST(SchedulerTest, QuantizedKvReuseEqualsCacheOff) {
  const Model& m = SmallModel("f32");
  ThreadPool pool(2);
  std::mt19937 rng(5);
  std::vector<int32_t> warm(45);
  for (auto& t : warm) t = static_cast<int32_t>(rng() % 1000) + 3;
  SchedulerOptions f16;
  f16.block_size = 8;
  f16.kv_blocks = 256;
  f16.n_ctx = 256;
  auto f16_s = MakeScheduler(m, pool, f16);
  const Outcome f16_run = RunAll(*f16_s, {Greedy(warm, 8)})[0];
  for (auto [kt, vt] : {std::pair{KvType::kQ8_0, KvType::kQ8_0}, {KvType::kQ4_0, KvType::kQ4_0}, {KvType::kF16, KvType::kQ4_0}}) {
    const std::string types = std::string(KvTypeName(kt)) + "/" + KvTypeName(vt);
    SCOPED_TRACE(types);
    SchedulerOptions on = f16;
    on.kv_type_k = kt;
    on.kv_type_v = vt;
    SchedulerOptions off = on;
    off.prefix_cache = false;
    double worst = 0;
    auto check = [&](Scheduler& s, const Request& r, int expect_cached, const std::string& what) {
      auto hot = RunAll(s, {r});
      EXPECT_EQ(hot[0].result.n_cached, expect_cached) << what;
      auto cold_s = MakeScheduler(m, pool, off);
      auto cold = RunAll(*cold_s, {r});
      ASSERT_EQ(hot[0].logits.size(), cold[0].logits.size()) << what;
      for (size_t k = 0; k < cold[0].logits.size(); ++k) {
        const double d = testing::MaxRelDiff(hot[0].logits[k], cold[0].logits[k]);
        EXPECT_LT(d, 0.03) << what << " step " << k;
        worst = testing::Worse(worst, d);
      }
      EXPECT_EQ(s.cache().CheckInvariants(), "") << what;
    };
    auto s = MakeScheduler(m, pool, on);
    auto first = RunAll(*s, {Greedy(warm, 8)});
    // The type is used: not f16's logits, but near them.
    ASSERT_EQ(first[0].logits.size(), f16_run.logits.size());
    const double vs_f16 = testing::MaxRelDiff(first[0].logits[0], f16_run.logits[0]);
    EXPECT_GT(vs_f16, 1e-4);
    EXPECT_LT(vs_f16, 0.2);
    for (const ReuseCase& c : DivergingAndNextTurn(warm, first[0].tokens, 4)) check(*s, c.req, c.cached, c.what);
    EXPECT_GT(s->metrics().partial_copies, 0);
    std::printf("[kv %s] first logits vs f16 %.4f, worst hot vs cold %.2e\n", types.c_str(), vs_f16, worst);
  }
  // Capacity: the same bytes hold more blocks of the quantized types (head_dim 64: rows
  // of 128, 68 and 36 bytes).
  SchedulerOptions mem = f16;
  mem.kv_blocks = 0;
  mem.kv_memory_bytes = 64 << 20;
  const int64_t n_f16 = MakeScheduler(m, pool, mem)->options().kv_blocks;
  mem.kv_type_k = mem.kv_type_v = KvType::kQ8_0;
  const int64_t n_q8 = MakeScheduler(m, pool, mem)->options().kv_blocks;
  mem.kv_type_k = mem.kv_type_v = KvType::kQ4_0;
  const int64_t n_q4 = MakeScheduler(m, pool, mem)->options().kv_blocks;
  EXPECT_GE(static_cast<double>(n_q8) / n_f16, 1.8);
  EXPECT_GE(static_cast<double>(n_q4) / n_f16, 3.5);
  EXPECT_EQ(MakeScheduler(m, pool, mem)->metrics().kv_bytes_per_token, 2.0 * 2 * 2 * 36);  // 2 layers, K+V, 2 heads
}

TEST(SchedulerTest, EvictsColdPrefixesUnderPressure) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 12;
  o.n_ctx = 128;
  auto s = MakeScheduler(m, pool, o);
  std::mt19937 rng(3);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p(70);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 1000) + 3;
    auto r = RunAll(*s, {Greedy(p, 3, false)});
    EXPECT_EQ(r[0].tokens.size(), 3u);
  }
  const SchedulerMetrics mt = s->metrics();
  EXPECT_GT(mt.evicted_blocks, 0);
  EXPECT_EQ(s->cache().CheckInvariants(), "");
  // Everything the tree holds can be evicted: nothing leaked.
  s->cache().Evict(o.kv_blocks);
  EXPECT_EQ(s->pool().n_free(), o.kv_blocks);
}

TEST(SchedulerTest, PreemptsInsteadOfFailingAndStaysCorrect) {
  const Model& m = SmallModel("f32");
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 8;
  o.kv_blocks = 14;  // 112 positions for 4 sessions that each grow to ~60
  o.n_ctx = 128;
  std::vector<Request> reqs;
  std::mt19937 rng(9);
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(20);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 1000) + 3;
    reqs.push_back(Greedy(p, 40));
  }
  auto s = MakeScheduler(m, pool, o);
  auto out = RunAll(*s, reqs);
  EXPECT_GT(s->metrics().preemptions, 0);
  SchedulerOptions off = o;
  off.prefix_cache = false;
  off.kv_blocks = 64;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(out[i].result.reason, FinishReason::kLength);
    auto solo_s = MakeScheduler(m, pool, off);
    auto solo = RunAll(*solo_s, {reqs[i]});
    EXPECT_EQ(out[i].tokens, solo[0].tokens) << "request " << i;
  }
}

// Request::prompt_logits: every prompt position's logits, computed whole even when the
// prefix is cached (n_cached 0), the last row the one the first token is drawn from;
// refused unless the scheduler was made for it. RunOne (run_one.h) drives it.
TEST(SchedulerTest, PromptLogitsComputeThePromptWholeAndEndWithTheFirstDraw) {
  const Model& m = SmallModel("f32");
  const int n_vocab = m.config().n_vocab;
  ThreadPool pool(2);
  SchedulerOptions so;
  so.block_size = 16;
  so.max_batch_tokens = 32;  // the 70-token prompt in three chunks
  so.prefill_chunk = 32;
  so.prompt_logits = true;
  auto s = Scheduler::Create(m, so, pool);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(1 + (i * 7) % (n_vocab - 1));
  Request warm;
  warm.prompt = prompt;
  warm.max_tokens = 1;
  warm.logits = true;
  warm.sampling.temperature = 0;
  auto first = RunOne(**s, warm);  // caches the prefix; its step 0 row is the last prompt row
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Request r = warm;
  r.prompt_logits = true;
  auto got = RunOne(**s, r);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->result.n_cached, 0);
  ASSERT_EQ(got->result.prompt_logits.size(), prompt.size() * static_cast<size_t>(n_vocab));
  const std::vector<float> last(got->result.prompt_logits.end() - n_vocab, got->result.prompt_logits.end());
  EXPECT_LT(testing::MaxRelDiff(last, first->step_logits), 1e-4);
  // Each row is that position's own: the row of position 40 equals the last row of the
  // same request cut after 41 tokens.
  Request cut = r;
  cut.prompt.resize(41);
  auto c = RunOne(**s, cut);
  ASSERT_TRUE(c.ok());
  const std::vector<float> row40(got->result.prompt_logits.begin() + 40 * n_vocab,
                                 got->result.prompt_logits.begin() + 41 * n_vocab);
  const std::vector<float> c_last(c->result.prompt_logits.end() - n_vocab, c->result.prompt_logits.end());
  EXPECT_LT(testing::MaxRelDiff(row40, c_last), 1e-4);
  so.prompt_logits = false;
  auto plain = Scheduler::Create(m, so, pool);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(RunOne(**plain, r).status().code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, CancelFreesBlocks) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  auto s = MakeScheduler(m, pool, SchedulerOptions{.block_size = 16, .kv_blocks = 32});
  std::vector<int32_t> p(50, 7);
  RequestResult res;
  auto id = s->Submit(Greedy(p, 100, false), nullptr, [&](RequestId, const RequestResult& r) { res = r; });
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 5; ++i) s->Step();
  s->Cancel(*id);
  s->RunUntilIdle();
  EXPECT_EQ(res.reason, FinishReason::kCancelled);
  EXPECT_EQ(s->pool().n_used(), s->cache().stats().n_cached_blocks);  // only the tree holds blocks
  s->cache().Evict(32);
  EXPECT_EQ(s->pool().n_free(), 32);
}

// logit_bias reaches the sampler of a batched session: the banned ids never appear, and a
// bias of +100 on one id makes it the whole reply.
TEST(SchedulerTest, LogitBiasBansAndForcesTokens) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  auto s = MakeScheduler(m, pool, SchedulerOptions{.block_size = 16, .kv_blocks = 32});
  const std::vector<int32_t> p = {1, 5, 9, 13, 17, 21};
  const Outcome plain = RunAll(*s, {Greedy(p, 8, false)})[0];
  ASSERT_EQ(plain.tokens.size(), 8u);
  Request ban = Greedy(p, 8, false);
  for (int32_t t : plain.tokens) ban.sampling.logit_bias.emplace_back(t, -100.0f);
  Request force = Greedy(p, 8, false);
  force.sampling.logit_bias = {{42, 100.0f}};
  force.sampling.temperature = 0.9f;
  const auto out = RunAll(*s, {ban, force});
  ASSERT_EQ(out[0].tokens.size(), 8u);
  for (int32_t t : out[0].tokens) {
    EXPECT_EQ(std::count(plain.tokens.begin(), plain.tokens.end(), t), 0) << "banned token " << t << " sampled";
  }
  EXPECT_EQ(out[1].tokens, std::vector<int32_t>(8, 42));
}

TEST(SchedulerTest, LongPromptDoesNotStallRunningDecode) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  SchedulerOptions o;
  o.max_batch_tokens = 64;
  o.prefill_chunk = 32;
  o.n_ctx = 1024;
  auto s = MakeScheduler(m, pool, o);
  int decoded = 0;
  auto a = s->Submit(Greedy({1, 2, 3}, 50, false), [&](RequestId, int32_t, std::span<const float>) { ++decoded; }, nullptr);
  ASSERT_TRUE(a.ok());
  s->Step();  // prefill of the short prompt + first token
  std::vector<int32_t> long_prompt(600, 9);
  ASSERT_TRUE(s->Submit(Greedy(long_prompt, 1, false), nullptr, nullptr).ok());
  const int before = decoded;
  for (int i = 0; i < 10; ++i) s->Step();  // the long prompt needs ~19 chunk steps
  EXPECT_EQ(decoded - before, 10);         // one token per step regardless
}

TEST(SchedulerTest, BadRequestsAreRefused) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  auto s = MakeScheduler(m, pool, SchedulerOptions{.block_size = 16, .kv_blocks = 4, .n_ctx = 512});
  EXPECT_EQ(s->Submit(Greedy({}, 4), nullptr, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Submit(Greedy({1, 99999}, 4), nullptr, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Submit(Greedy(std::vector<int32_t>(600, 1), 4), nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  // Fits the context but never the pool (4 blocks of 16).
  EXPECT_EQ(s->Submit(Greedy(std::vector<int32_t>(100, 1), 4), nullptr, nullptr).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(s->Idle());
}

// Steady-state decode allocates nothing: once 6 sessions are decoding, further steps
// perform zero heap allocations.
TEST(SchedulerTest, DecodeStepsDoNotAllocate) {
  const Model& m = SmallModel("q4_0");
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 16;
  auto s = MakeScheduler(m, pool, o);
  int64_t tokens = 0;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(40, 5 + i);
    ASSERT_TRUE(s->Submit(Greedy(p, 60, false), [&](RequestId, int32_t, std::span<const float>) { ++tokens; }, nullptr).ok());
  }
  for (int i = 0; i < 8; ++i) s->Step();  // admission and prefill done, decoding
  const int64_t t0 = tokens;
  const int64_t a0 = g_allocs.load();
  for (int i = 0; i < 20; ++i) s->Step();
  const int64_t allocs = g_allocs.load() - a0;
  EXPECT_EQ(tokens - t0, 6 * 20);
  EXPECT_EQ(allocs, 0) << "heap allocations in 20 decode steps";
}

}  // namespace
}  // namespace trellis
