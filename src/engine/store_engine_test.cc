// Engines on the prefix tensor store: two schedulers (two "nodes", each with its own
// pool, tree and store client) sharing store servers over real UCX on loopback. The
// central property: a request's greedy tokens and logits are the same whether its prefix
// was computed, taken from the local cache, or read from the store.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "engine/kv_layout.h"
#include "engine/scheduler.h"
#include "engine/store_bridge.h"
#include "engine/test_models.h"
#include "engine/test_scheduler.h"
#include "store/server.h"
#include "store/store_process.h"
#include "util/slowdown.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using testing::Greedy;
using testing::Outcome;
using testing::RunAll;

// The model the schedulers run: a small dense one, or (MoeModel, for one test) a mixture.
const Model* g_model = nullptr;
const Model& TestModel() {
  static std::unique_ptr<Model> m = [] {
    auto r = Model::Load(testing::WriteSmallModel("store_engine_f32.gguf", "f32"));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }();
  return g_model ? *g_model : *m;
}

// The in-process tests run on the in-memory transport (TransportOptions::loopback); tests
// with another process (a `trellis store`, a forked child) on UCX over lo.
bool g_ucx = false;
struct UcxForThisTest {
  UcxForThisTest() { g_ucx = true; }
  ~UcxForThisTest() { g_ucx = false; }
};

net::TransportOptions Lo() {
  net::TransportOptions o;
  o.net_devices = "lo";
  o.loopback = !g_ucx;
  return o;
}

std::unique_ptr<store::StoreServer> StoreServer() {
  store::ServerOptions o;
  o.mem_bytes = 32 << 20;
  o.transport = Lo();
  auto s = store::StoreServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// A bridge to store servers at `addrs` (the first is the local one); `reader`, if set,
// replaces the bridge's reads (StoreBridgeOptions::reader).
std::unique_ptr<StoreBridge> BridgeTo(const std::vector<std::string>& addrs, std::chrono::milliseconds timeout = 2000ms,
                                      decltype(StoreBridgeOptions::reader) reader = nullptr) {
  StoreBridgeOptions o;
  o.client.servers = addrs;
  o.client.local = addrs[0];
  o.reader = std::move(reader);
  o.client.transport = Lo();
  o.fetch_timeout = timeout;
  o.publish_timeout = timeout;
  auto b = StoreBridge::Connect(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

std::unique_ptr<StoreBridge> Bridge(const std::vector<const store::StoreServer*>& servers, size_t local = 0,
                                    std::chrono::milliseconds timeout = 2000ms,
                                    std::chrono::milliseconds compute_bound_slack = 5ms) {
  StoreBridgeOptions o;
  o.compute_bound_slack = compute_bound_slack;
  for (auto* s : servers) o.client.servers.push_back("127.0.0.1:" + std::to_string(s->port()));
  o.client.local = o.client.servers[local];
  o.client.transport = Lo();
  o.fetch_timeout = timeout;
  o.publish_timeout = timeout;
  auto b = StoreBridge::Connect(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

std::unique_ptr<Scheduler> Make(ThreadPool& pool, SchedulerOptions o) {
  auto s = Scheduler::Create(TestModel(), o, pool);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

// bound: 1e-4 of the logits' spread (summation order); a quantized cache may land a
// K/V element on the next code where a rounding step moved it (SchedulerTest's
// QuantizedKvReuseEqualsCacheOff): 0.03.
void ExpectSameOutput(const Outcome& got, const Outcome& want, const std::string& what, double bound = 1e-4) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t k = 0; k < want.logits.size(); ++k) {
    EXPECT_LT(testing::MaxRelDiff(got.logits[k], want.logits[k]), bound) << what << " step " << k;
  }
}

// Node A computes prompts sharing system prompts and publishes them; node B, with an
// empty cache of its own, reads the prefixes from the store (spread over two servers),
// computes only the rest, and produces what a cold engine without any cache produces.
void AnotherNodeReadsThePrefix(int rounds, KvType kt = KvType::kF16, KvType vt = KvType::kF16) {
  auto s1 = StoreServer(), s2 = StoreServer();
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (int round = 0; round < rounds; ++round) {
    const int bs = std::vector<int>{8, 16, 32}[static_cast<size_t>(round)];
    SchedulerOptions o;
    o.block_size = bs;
    o.kv_blocks = 160;
    o.n_ctx = 512;
    o.prefill_chunk = std::vector<int>{24, 64, 512}[static_cast<size_t>(round)];
    o.kv_type_k = kt;
    o.kv_type_v = vt;
    std::vector<std::vector<int32_t>> systems(2);
    for (auto& sys : systems) {
      sys.resize(static_cast<size_t>(40 + rng() % 100));
      for (auto& t : sys) t = static_cast<int32_t>(rng() % 1000) + 3;
    }
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p = systems[static_cast<size_t>(i) % systems.size()];
      const int suffix = 1 + static_cast<int>(rng() % 30);
      for (int k = 0; k < suffix; ++k) p.push_back(static_cast<int32_t>(rng() % 1000) + 3);
      reqs.push_back(Greedy(p, 2 + static_cast<int>(rng() % 6)));
    }
    auto ba = Bridge({s1.get(), s2.get()}, 0), bb = Bridge({s1.get(), s2.get()}, 1);
    ASSERT_TRUE(ba && bb);
    SchedulerOptions oa = o, ob = o;
    oa.store = ba.get();
    ob.store = bb.get();
    auto a = Make(pool, oa);
    RunAll(*a, reqs);
    ba->Drain();  // A's publishes are in the store
    EXPECT_GT(ba->stats().published_blocks, 0u) << "round " << round;

    auto b = Make(pool, ob);
    auto got = RunAll(*b, {reqs[0]});  // alone first: everything before the suffix from the store
    auto rest = RunAll(*b, std::vector<Request>(reqs.begin() + 1, reqs.end()));
    got.insert(got.end(), rest.begin(), rest.end());
    const SchedulerMetrics mb = b->metrics();
    EXPECT_GT(mb.store_tokens, 0) << "round " << round;
    const CacheReceipt& c0 = got[0].result.cache;
    const int whole = (static_cast<int>(reqs[0].prompt.size()) - 1) / bs * bs;
    EXPECT_EQ(c0.local, 0);
    // A published reqs[0]'s prompt and what it generated: every whole block but the
    // last position's is in the store.
    EXPECT_EQ(c0.store, whole) << "round " << round;
    EXPECT_EQ(c0.store_memory + c0.store_replica + c0.store_ssd + c0.store_remote, c0.store);
    EXPECT_EQ(c0.computed, static_cast<int>(reqs[0].prompt.size()) - whole);
    EXPECT_EQ(got[0].result.n_cached, whole);
    EXPECT_EQ(b->cache().CheckInvariants(), "");

    SchedulerOptions off = o;
    off.prefix_cache = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto cold = Make(pool, off);
      auto want = RunAll(*cold, {reqs[i]});
      ExpectSameOutput(got[i], want[0], "round " + std::to_string(round) + " request " + std::to_string(i),
                       kt == KvType::kF16 && vt == KvType::kF16 ? 1e-4 : 0.03);
    }
    b.reset();
    a.reset();
  }
}

TEST(StoreEngine, AnotherNodeReadsThePrefixAndOutputIsUnchanged) { AnotherNodeReadsThePrefix(3); }

// Quantized blocks (smaller: 68- and 36-byte rows) go through the store as f16 ones do.
TEST(StoreEngine, QuantizedKvPrefixesGoThroughTheStore) {
  AnotherNodeReadsThePrefix(1, KvType::kQ8_0, KvType::kQ8_0);
  AnotherNodeReadsThePrefix(1, KvType::kQ4_0, KvType::kQ8_0);
}

// K/V depend on attention only: a mixture of experts' prefixes go through the store as a
// dense model's do (one round: blocks of 8, prefill chunks of 24).
TEST(StoreEngine, AMixtureOfExpertsReadsPrefixesFromTheStoreToo) {
  auto m = Model::Load(testing::ReferenceModelPath("ref-qwen3moe-q8_0"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE((*m)->config().moe());
  g_model = m->get();
  AnotherNodeReadsThePrefix(1);
  g_model = nullptr;
}

// A store that goes away is a miss, counted, and the request is computed locally with
// the same output; nothing hangs past the fetch deadline.
TEST(StoreEngine, ADeadStoreDegradesToLocalCaching) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  auto bridge = Bridge({s1.get()}, 0, 300ms);
  ASSERT_TRUE(bridge);
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  o.store = bridge.get();
  std::vector<int32_t> p(100);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(7 + i * 13 % 1000);
  s1.reset();  // gone
  auto sched = Make(pool, o);
  auto got = RunAll(*sched, {Greedy(p, 4)});
  EXPECT_EQ(got[0].result.reason, FinishReason::kLength);
  EXPECT_EQ(got[0].result.cache.store, 0);
  const int missed = got[0].result.cache.misses[static_cast<int>(StoreMiss::kDown)] +
                     got[0].result.cache.misses[static_cast<int>(StoreMiss::kDeadline)];
  EXPECT_EQ(missed, (100 - 1) / 16 * 16);
  EXPECT_EQ(got[0].result.cache.computed, 100);
  SchedulerOptions off = o;
  off.store = nullptr;
  off.prefix_cache = false;
  auto cold = Make(pool, off);
  ExpectSameOutput(got[0], RunAll(*cold, {Greedy(p, 4)})[0], "dead store");
  // The same prompt again: the local cache serves it, the store is not needed.
  auto again = RunAll(*sched, {Greedy(p, 4)});
  EXPECT_EQ(again[0].result.cache.local, (100 - 1) / 16 * 16 + 3);  // whole blocks + the copied tail, to the token
  bridge->Drain();
  EXPECT_GT(bridge->stats().publishes_failed, 0u);
}

// Another salt, block size or K/V type is another namespace: nothing of A's is read.
TEST(StoreEngine, OtherNamespacesReadNothing) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  auto ba = Bridge({s1.get()}), bb = Bridge({s1.get()});
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  o.store = ba.get();
  std::vector<int32_t> p(90);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(11 + i * 7 % 1000);
  auto a = Make(pool, o);
  RunAll(*a, {Greedy(p, 2)});
  ba->Drain();
  SchedulerOptions salted = o, wider = o;
  salted.store = bb.get();
  wider.store = bb.get();
  wider.block_size = 32;
  auto b1 = Make(pool, salted);
  Request r = Greedy(p, 2);
  r.cache_salt = 99;
  auto g1 = RunAll(*b1, {r});
  EXPECT_EQ(g1[0].result.cache.store, 0);
  EXPECT_GT(g1[0].result.cache.misses[static_cast<int>(StoreMiss::kNotStored)], 0);
  auto b2 = Make(pool, wider);
  auto g2 = RunAll(*b2, {Greedy(p, 2)});
  EXPECT_EQ(g2[0].result.cache.store, 0);
  // Another K/V type is another namespace too: f16 blocks are never read as q8_0 ones.
  SchedulerOptions quantized = o;
  quantized.store = bb.get();
  quantized.kv_type_k = quantized.kv_type_v = KvType::kQ8_0;
  auto b4 = Make(pool, quantized);
  auto g4 = RunAll(*b4, {Greedy(p, 2)});
  EXPECT_EQ(g4[0].result.cache.store, 0);
  EXPECT_GT(g4[0].result.cache.misses[static_cast<int>(StoreMiss::kNotStored)], 0);
  // The same namespace does read it.
  SchedulerOptions same = o;
  same.store = bb.get();
  auto b3 = Make(pool, same);
  EXPECT_EQ(RunAll(*b3, {Greedy(p, 2)})[0].result.cache.store, (90 - 1) / 16 * 16);
}

// Single-flight: node A starts computing a new prompt (its fetch claimed the blocks);
// node B, asked for the same prompt meanwhile, waits for A's blocks instead of computing
// them, reads them, and answers what A answers. The prefix is computed once.
TEST(StoreEngine, TwoNodesNeedingANewPrefixComputeItOnce) {
  auto s1 = StoreServer();
  ThreadPool pool_a(1), pool_b(1);
  auto ba = Bridge({s1.get()}), bb = Bridge({s1.get()});
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  o.prefill_chunk = 16;  // A computes the prompt over many steps
  o.max_batch_tokens = 16;
  std::vector<int32_t> p(300);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(3 + (i * 37 + 11) % 1000);
  SchedulerOptions oa = o, ob = o;
  oa.store = ba.get();
  ob.store = bb.get();
  auto a = Make(pool_a, oa);
  auto b = Make(pool_b, ob);
  Outcome out_a;
  ASSERT_TRUE(a->Submit(Greedy(p, 3),
                        [&](RequestId, int32_t t, std::span<const float> l) {
                          out_a.tokens.push_back(t);
                          out_a.logits.emplace_back(l.begin(), l.end());
                        },
                        [&](RequestId, const RequestResult& r) { out_a.result = r; })
                  .ok());
  while (a->metrics().store_fetches == 0) a->Step();  // A's lookup claimed the blocks
  std::vector<Outcome> out_b;
  std::thread node_b([&] { out_b = RunAll(*b, {Greedy(p, 3)}); });
  // Let B ask (and find A's claim) before A goes on.
  for (int i = 0; i < 500 && s1->stats().claim_waits == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(s1->stats().claim_waits, 1u);
  a->RunUntilIdle();
  node_b.join();
  ASSERT_EQ(out_b.size(), 1u);
  const int whole = (300 - 1) / 16 * 16;
  EXPECT_EQ(out_a.result.cache.computed, 300);
  const CacheReceipt& c = out_b[0].result.cache;
  EXPECT_EQ(c.store, whole);
  EXPECT_EQ(c.waited_for, whole);
  EXPECT_EQ(c.computed, 300 - whole);
  EXPECT_EQ(b->metrics().store_waited_tokens, whole);
  ExpectSameOutput(out_b[0], out_a, "node B");
}

// Passes everything through, but with a floor on the fetch's estimate of computing a
// block: the fetch's deadline (lookup included) is that estimate, milliseconds for this
// test model, which a loaded machine's lookup can miss (a kDeadline miss, also computed
// at once) before the test learns whether the claim was waited for.
class SlowComputeStore : public PrefixStore {
 public:
  SlowComputeStore(PrefixStore& inner, double seconds_per_block) : inner_(inner), floor_(seconds_per_block) {}
  void StartFetch(StoreFetch f) override {
    f.compute_seconds_per_block = std::max(f.compute_seconds_per_block, floor_);
    inner_.StartFetch(std::move(f));
  }
  void StartPublish(StorePublish p) override { inner_.StartPublish(std::move(p)); }
  void GiveUp(const StoreNamespace& ns, std::vector<int32_t> tokens) override { inner_.GiveUp(ns, std::move(tokens)); }
  void Poll(std::vector<StoreFetchDone>* fetched, std::vector<StorePublishDone>* published,
            std::chrono::microseconds wait) override {
    inner_.Poll(fetched, published, wait);
  }
  void Drain() override { inner_.Drain(); }
  void AbandonQueued() override { inner_.AbandonQueued(); }
  size_t in_flight() const override { return inner_.in_flight(); }

 private:
  PrefixStore& inner_;
  double floor_;
};

// A node that dies after its fetch claimed a prefix: it never publishes and never gives
// the claims up (GiveUp is lost with it).
class DiesWithItsClaims : public SlowComputeStore {
 public:
  explicit DiesWithItsClaims(PrefixStore& inner) : SlowComputeStore(inner, 0) {}
  void GiveUp(const StoreNamespace&, std::vector<int32_t>) override {}
};

// A node that claimed a prefix and never delivers holds nobody up for longer than
// computing it would take: B waits about that long, then computes it itself.
TEST(StoreEngine, AClaimThatNeverCompletesIsWaitedForOnlyBriefly) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  auto ba = Bridge({s1.get()}), bb = Bridge({s1.get()});
  DiesWithItsClaims dying_a(*ba);
  // B believes a block takes 50 ms to compute: 12 blocks, a 0.6 s wait bound.
  SlowComputeStore slow_b(*bb, 0.05);
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  std::vector<int32_t> p(200), warm(100);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(3 + (i * 53 + 7) % 1000);
  for (size_t i = 0; i < warm.size(); ++i) warm[i] = static_cast<int32_t>(5 + (i * 17) % 1000);
  SchedulerOptions oa = o, ob = o;
  oa.store = &dying_a;
  ob.store = &slow_b;
  auto b = Make(pool, ob);
  RunAll(*b, {Greedy(warm, 1)});  // B has measured its prefill rate
  {
    auto a = Make(pool, oa);
    ASSERT_TRUE(a->Submit(Greedy(p, 2), nullptr, nullptr).ok());
    while (a->metrics().store_fetches == 0) a->Step();  // claimed
    a->CancelAll();  // and gone: the claim stays until it expires
  }
  ba->Drain();
  EXPECT_EQ(ba->stats().claims_given_up, 0u);
  const auto t0 = std::chrono::steady_clock::now();
  auto got = RunAll(*b, {Greedy(p, 2)});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got[0].result.cache.store, 0);
  EXPECT_EQ(got[0].result.cache.computed, 200);
  EXPECT_GT(got[0].result.cache.misses[static_cast<int>(StoreMiss::kPendingTimeout)], 0);
  EXPECT_GT(s, 0.3);  // it did wait for the claim (about the 0.6 s bound)
  EXPECT_LT(s, 5.0 * TestSlowdown());  // but not the claim's minute
  SchedulerOptions off = o;
  off.prefix_cache = false;
  auto cold = Make(pool, off);
  ExpectSameOutput(got[0], RunAll(*cold, {Greedy(p, 2)})[0], "after the wait");
}

// A request cancelled after its fetch claimed the prompt's blocks, before it published
// them, gives the claims up: another engine asking for the same prompt computes it at
// once instead of waiting (as it must in AClaimThatNeverCompletesIsWaitedForOnlyBriefly).
TEST(StoreEngine, ACancelledRequestGivesUpItsClaims) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  auto ba = Bridge({s1.get()}), bb = Bridge({s1.get()});
  SlowComputeStore slow_b(*bb, 0.05);  // as there: a claim would cost B about 0.6 s
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  std::vector<int32_t> p(200), warm(100);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(3 + (i * 59 + 5) % 1000);
  for (size_t i = 0; i < warm.size(); ++i) warm[i] = static_cast<int32_t>(5 + (i * 19) % 1000);
  SchedulerOptions oa = o, ob = o;
  oa.store = ba.get();
  ob.store = &slow_b;
  auto b = Make(pool, ob);
  RunAll(*b, {Greedy(warm, 1)});
  {
    auto a = Make(pool, oa);
    ASSERT_TRUE(a->Submit(Greedy(p, 2), nullptr, nullptr).ok());
    while (a->metrics().store_fetches == 0) a->Step();  // claimed
    a->CancelAll();
    a->RunUntilIdle();
  }
  ba->Drain();  // the give-up has reached the store
  EXPECT_EQ(ba->stats().claims_given_up, 1u);
  auto got = RunAll(*b, {Greedy(p, 2)});
  EXPECT_EQ(got[0].result.cache.computed, 200);
  EXPECT_EQ(got[0].result.cache.misses[static_cast<int>(StoreMiss::kPendingTimeout)], 0);
  EXPECT_EQ(got[0].result.cache.waited_for, 0);
}

// An engine whose publish fails (here: a store too small for it) drops the claims its
// fetch made, so another engine asking for the same prompt computes it at once instead of
// waiting for the claims to expire (a minute, before either engine has measured its rate).
TEST(StoreEngine, AFailedPublishGivesUpItsClaims) {
  store::ServerOptions so;
  so.mem_bytes = 4096;  // holds no block of this model
  so.transport = Lo();
  auto tiny = store::StoreServer::Start(so);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  ThreadPool pool(2);
  auto ba = Bridge({tiny->get()}), bb = Bridge({tiny->get()});
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  std::vector<int32_t> p(200);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(3 + (i * 31 + 11) % 1000);
  SchedulerOptions oa = o, ob = o;
  oa.store = ba.get();
  ob.store = bb.get();
  {
    auto a = Make(pool, oa);
    RunAll(*a, {Greedy(p, 2)});
    ba->Drain();
    a->RunUntilIdle();
    ASSERT_GT(a->metrics().store_publish_failures, 0);
  }
  auto b = Make(pool, ob);
  const auto t0 = std::chrono::steady_clock::now();
  auto got = RunAll(*b, {Greedy(p, 2)});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got[0].result.cache.computed, 200);
  EXPECT_EQ(got[0].result.cache.misses[static_cast<int>(StoreMiss::kPendingTimeout)], 0);
  EXPECT_EQ(got[0].result.cache.waited_for, 0);
  EXPECT_LT(s, 10.0 * TestSlowdown());  // not the claim's minute
}

// Blocks stored with another block size under the same keys are refused as a
// fingerprint mismatch, and nothing is written to the reader's buffers; any other
// refusal is a store error, never "down".
TEST(StoreEngine, BlocksOfAnotherSizeAreAFingerprintMismatch) {
  auto s1 = StoreServer();
  auto bridge = Bridge({s1.get()});
  StoreNamespace ns;
  ns.model_fingerprint = 0xabc;
  ns.block_tokens = 8;
  std::vector<int32_t> tokens(32);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(7 + i);
  std::vector<std::vector<uint8_t>> data(4, std::vector<uint8_t>(4096, 0x21));
  StorePublish p;
  p.id = 1;
  p.ns = ns;
  p.tokens = tokens;
  for (auto& d : data) p.blocks.push_back(d.data());
  p.block_ids = {0, 1, 2, 3};
  p.block_bytes = 4096;
  p.local = LocalSlice{0, 4096};
  p.cost_seconds = 1;
  bridge->StartPublish(std::move(p));
  bridge->Drain();
  std::vector<StoreFetchDone> fetched;
  std::vector<StorePublishDone> published;
  bridge->Poll(&fetched, &published, 0us);
  ASSERT_EQ(published.size(), 1u);
  ASSERT_TRUE(published[0].status.ok()) << published[0].status.ToString();
  std::vector<std::vector<uint8_t>> dst(4, std::vector<uint8_t>(8192, 0));
  StoreFetch f;
  f.id = 2;
  f.ns = ns;
  f.tokens = tokens;
  for (auto& d : dst) f.dst.push_back(d.data());
  f.dst_blocks = {0, 1, 2, 3};
  f.block_bytes = 8192;  // the same keys, read as blocks of another size
  f.local = LocalSlice{0, 8192};
  bridge->StartFetch(std::move(f));
  bridge->Drain();
  bridge->Poll(&fetched, &published, 0us);
  ASSERT_EQ(fetched.size(), 1u);
  EXPECT_EQ(fetched[0].blocks, 0);
  EXPECT_EQ(fetched[0].miss, StoreMiss::kFingerprint) << StoreMissName(fetched[0].miss);
  for (auto& d : dst) EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](uint8_t b) { return b == 0; }));
}

// Destroying an engine while a fetch is in flight waits for it (bounded) and frees
// everything: nothing writes into a pool that is gone (ASan checks this run).
TEST(StoreEngine, ShutdownWithAFetchInFlightIsClean) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  auto bridge = Bridge({s1.get()});
  SchedulerOptions o;
  o.block_size = 8;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  o.store = bridge.get();
  std::vector<int32_t> p(200);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(5 + i * 31 % 1000);
  {
    auto a = Make(pool, o);
    RunAll(*a, {Greedy(p, 1)});
  }
  bridge->Drain();
  for (int i = 0; i < 5; ++i) {
    auto b = Make(pool, o);
    bool finished = false;
    ASSERT_TRUE(b->Submit(Greedy(p, 3), nullptr, [&](RequestId, const RequestResult&) { finished = true; }).ok());
    b->Step();  // admitted: the fetch is in flight
    if (i % 2) {
      b->CancelAll();
      EXPECT_TRUE(finished);
    }
    b.reset();
    EXPECT_EQ(bridge->in_flight(), 0u);
  }
}

// What a cold engine (no cache, no store) answers.
Outcome Cold(ThreadPool& pool, SchedulerOptions o, const Request& r) {
  o.store = nullptr;
  o.prefix_cache = false;
  auto cold = Make(pool, o);
  return RunAll(*cold, {r})[0];
}

std::vector<int32_t> Prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % 1000) + 3;
  return p;
}

// The next turn of a conversation on another node: A answers a prompt and publishes the
// prompt and what it generated; B is asked the prompt, A's answer and a new message, and
// reads from the store every whole block A computed, generated tokens included (A never
// fed its last token, so its K/V stops one short), then answers what a cold engine does.
TEST(StoreEngine, TheNextTurnOnAnotherNodeReadsTheGeneratedTokensToo) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 8;
  o.kv_blocks = 96;
  o.n_ctx = 512;
  const auto prompt = Prompt(61, 17);
  auto ba = Bridge({s1.get()}), bb = Bridge({s1.get()});
  ASSERT_TRUE(ba && bb);
  SchedulerOptions oa = o, ob = o;
  oa.store = ba.get();
  ob.store = bb.get();
  auto a = Make(pool, oa);
  const auto first = RunAll(*a, {Greedy(prompt, 40)});
  ASSERT_EQ(first[0].tokens.size(), 40u);
  ba->Drain();
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), first[0].tokens.begin(), first[0].tokens.end());
  const size_t computed_by_a = next.size() - 1;
  for (int32_t t : {11, 12, 13, 14, 15}) next.push_back(t);
  auto b = Make(pool, ob);
  const auto got = RunAll(*b, {Greedy(next, 6)});
  const CacheReceipt& c = got[0].result.cache;
  EXPECT_EQ(c.store, static_cast<int>(computed_by_a / 8 * 8)) << "B read " << c.store << " of the " << computed_by_a
                                                              << " tokens A computed (prompt " << prompt.size() << ")";
  EXPECT_GT(c.store, static_cast<int>(prompt.size()));
  ExpectSameOutput(got[0], Cold(pool, o, Greedy(next, 6)), "the next turn");
}

// Engine options of the checksum tests: 16-token blocks.
SchedulerOptions SixteenTokenBlocks() {
  SchedulerOptions o;
  o.block_size = 16;
  o.kv_blocks = 64;
  o.n_ctx = 512;
  return o;
}

// An engine on its own bridge computes and publishes p (16-token blocks).
void PublishOn(store::StoreServer& s, ThreadPool& pool, const std::vector<int32_t>& p) {
  auto ba = Bridge({&s});
  ASSERT_TRUE(ba);
  SchedulerOptions oa = SixteenTokenBlocks();
  oa.store = ba.get();
  auto a = Make(pool, oa);
  RunAll(*a, {Greedy(p, 2)});
  ba->Drain();
  ASSERT_GT(ba->stats().published_blocks, 0u);
}

// PublishOn, then byte `at` of the third block (block 2) of every tensor on s is flipped.
void PublishThenCorruptBlock2(store::StoreServer& s, ThreadPool& pool, const std::vector<int32_t>& p, uint64_t at) {
  PublishOn(s, pool, p);
  const uint64_t block_bytes = KvLayoutFor(TestModel().config(), 16).BlockBytes();
  bool flipped = false;
  for (uint64_t tensor : s.TensorIdsForTesting()) flipped |= s.CorruptByteForTesting(tensor, 2 * block_bytes + at);
  ASSERT_TRUE(flipped);
}

// A byte flipped in a stored block: the engine's read of it fails its checksum, the
// fetch is a checksum miss (counted), and the request is computed with a cold engine's
// output. Nothing read before the bad block is trusted past it.
TEST(StoreEngine, AChecksumFailureInAFetchIsAMissAndTheOutputUnchanged) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  const SchedulerOptions o = SixteenTokenBlocks();
  const auto p = Prompt(100, 23);
  PublishThenCorruptBlock2(*s1, pool, p, 100);
  auto bb = Bridge({s1.get()});
  ASSERT_TRUE(bb);
  SchedulerOptions ob = o;
  ob.store = bb.get();
  auto b = Make(pool, ob);
  const auto got = RunAll(*b, {Greedy(p, 4)});
  const CacheReceipt& c = got[0].result.cache;
  EXPECT_GT(c.misses[static_cast<int>(StoreMiss::kChecksum)], 0) << "no checksum miss: store " << c.store;
  EXPECT_LE(c.store, 2 * 16);  // at most the blocks before the bad one
  EXPECT_EQ(c.store + c.local + c.computed, static_cast<int>(p.size()));
  ExpectSameOutput(got[0], Cold(pool, o, Greedy(p, 4)), "after a checksum failure");
  EXPECT_EQ(b->cache().CheckInvariants(), "");
}


// A fetch into a block that began with slots copied from a partial local match: the read
// overwrites those slots too, so when it fails (a checksum here, a dead store or a
// deadline alike) they hold whatever landed, and the engine must compute them again
// rather than trust the copy. B holds 2 whole blocks and 8 slots of the third from an
// earlier prompt; the store's copy of that third block is corrupt.
TEST(StoreEngine, AFailedFetchOverAPartialMatchComputesTheCopiedSlotsAgain) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  const SchedulerOptions o = SixteenTokenBlocks();
  const auto p = Prompt(100, 31);
  PublishThenCorruptBlock2(*s1, pool, p, 10);  // in block 2's first slot (layer 0's K)
  // B's earlier prompt measures its compute rate, which then bounds the fetch (this tiny
  // model's blocks compute in microseconds): without slack the read missed that deadline
  // on a loaded machine and never reached the checksum.
  auto bb = Bridge({s1.get()}, 0, 2000ms, 2000ms);
  ASSERT_TRUE(bb);
  SchedulerOptions ob = o;
  ob.store = bb.get();
  // B's own earlier prompt: p's first 40 tokens, then others (its first two blocks come
  // from the store, intact; the third is B's own, and shares 8 tokens with p's).
  auto q = std::vector<int32_t>(p.begin(), p.begin() + 40);
  for (int i = 0; i < 30; ++i) q.push_back(static_cast<int32_t>(900 + i));
  auto b = Make(pool, ob);
  RunAll(*b, {Greedy(q, 1)});
  bb->Drain();
  const auto got = RunAll(*b, {Greedy(p, 4)});
  const CacheReceipt& c = got[0].result.cache;
  std::string misses;
  for (int k = 1; k < kStoreMissKinds; ++k) misses += fmt::format(" {}={}", StoreMissName(static_cast<StoreMiss>(k)), c.misses[k]);
  EXPECT_GT(c.misses[static_cast<int>(StoreMiss::kChecksum)], 0) << "no checksum miss: store " << c.store << misses;
  EXPECT_EQ(c.store, 0);
  EXPECT_EQ(c.local, 32) << "the 8 copied slots were overwritten by the failed read: not reused";
  EXPECT_EQ(c.store + c.local + c.computed, static_cast<int>(p.size()));
  ExpectSameOutput(got[0], Cold(pool, o, Greedy(p, 4)), "after a failed fetch over a partial match");
  // And what B now caches is right: the prompt again reads it locally.
  const auto again = RunAll(*b, {Greedy(p, 4)});
  EXPECT_GT(again[0].result.cache.local, 32);
  ExpectSameOutput(again[0], Cold(pool, o, Greedy(p, 4)), "the prompt again, from the local cache");
  EXPECT_EQ(b->cache().CheckInvariants(), "");
}

// The whole model here, with an epoch the test moves: "a grid node lost its K/V".
class EpochExecutor final : public StepExecutor {
 public:
  EpochExecutor(const Model& m, const PagedKv& kv, int max_tokens, int max_logits, ThreadPool& tp, const std::atomic<uint64_t>& epoch)
      : local_(m, kv, max_tokens, max_logits, tp), epoch_(epoch) {}
  int depth() const override { return 1; }
  Status Launch(std::span<const SeqBatch> seqs) override { return local_.Launch(seqs); }
  Status Collect() override { return local_.Collect(); }
  const float* logits_row(int i) const override { return local_.logits_row(i); }
  void CopySlots(BlockPool& pool, int32_t src, int32_t dst, int32_t n) override { local_.CopySlots(pool, src, dst, n); }
  uint64_t epoch() const override { return epoch_.load(); }

 private:
  LocalExecutor local_;
  const std::atomic<uint64_t>& epoch_;
};

// Holds every fetch until Open() (and passes them on after): a fetch is in flight for as
// long as the test wants.
class GatedStore : public SlowComputeStore {
 public:
  explicit GatedStore(PrefixStore& inner) : SlowComputeStore(inner, 0), inner_(inner) {}
  void StartFetch(StoreFetch f) override {
    if (open_) return inner_.StartFetch(std::move(f));
    held_.push_back(std::move(f));
  }
  void Open() {
    open_ = true;
    for (auto& f : held_) inner_.StartFetch(std::move(f));
    held_.clear();
  }
  size_t held() const { return held_.size(); }
  size_t in_flight() const override { return inner_.in_flight() + held_.size(); }

 private:
  PrefixStore& inner_;
  std::vector<StoreFetch> held_;
  bool open_ = false;
};

// The grid loses a node's K/V (the epoch moves) while a session's store fetch is in
// flight: the session fails with the others, but its blocks stay its own until the
// fetch has landed; released at once, they went to the next sessions and the fetch then
// wrote the stored prefix into them (the chaos run's wrong grid answers).
TEST(StoreEngine, ASessionFailedDuringItsFetchKeepsItsBlocksUntilTheFetchLands) {
  auto s1 = StoreServer();
  ThreadPool pool(2);
  const SchedulerOptions o = SixteenTokenBlocks();
  const auto p = Prompt(100, 37);
  PublishOn(*s1, pool, p);
  auto bb = Bridge({s1.get()});
  ASSERT_TRUE(bb);
  GatedStore gate(*bb);
  std::atomic<uint64_t> epoch{0};
  SchedulerOptions ob = o;
  ob.store = &gate;
  ob.executor = [&](const PagedKv& kv, int32_t, int max_tokens, int max_logits, ThreadPool& tp)
      -> Result<std::unique_ptr<StepExecutor>> {
    return std::unique_ptr<StepExecutor>(std::make_unique<EpochExecutor>(TestModel(), kv, max_tokens, max_logits, tp, epoch));
  };
  auto b = Make(pool, ob);
  bool finished = false;
  RequestResult result;
  ASSERT_TRUE(b->Submit(Greedy(p, 4), [](RequestId, int32_t, std::span<const float>) {},
                        [&](RequestId, const RequestResult& r) { finished = true, result = r; }).ok());
  for (int i = 0; i < 100 && gate.held() == 0; ++i) b->Step();
  ASSERT_EQ(gate.held(), 1u) << "no fetch started";
  const int32_t used = b->pool().n_used();
  ASSERT_GT(used, 0);
  epoch = 1;
  for (int i = 0; i < 20; ++i) b->Step();
  EXPECT_EQ(b->pool().n_used(), used) << "the fetching session's blocks were released with its fetch in flight";
  EXPECT_FALSE(finished) << "finished before its fetch landed";
  gate.Open();
  for (int i = 0; i < 2000 && (!finished || b->store_pending()); ++i) {
    b->Step();
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(finished);
  EXPECT_EQ(result.reason, FinishReason::kError);
  EXPECT_FALSE(b->store_pending());
  EXPECT_EQ(b->pool().n_used(), b->cache().stats().n_cached_blocks) << "blocks leaked";
  // The engine serves on: the prompt again is right.
  const auto again = RunAll(*b, {Greedy(p, 4)});
  ExpectSameOutput(again[0], Cold(pool, o, Greedy(p, 4)), "after the lost epoch");
}
// A store process SIGKILLed in the middle of an engine's fetch, after part of it landed
// in the pool: the rest of the read fails, the fetch is a miss (store down or deadline,
// within the fetch's deadline), and the engine computes the prompt with a cold engine's
// output. The half-fetched blocks are never used, now or when the prompt comes back.
TEST(StoreEngine, AStoreKilledDuringAFetchIsAMissAndTheOutputUnchanged) {
  UcxForThisTest ucx;
  store::StoreProcess proc("64M");
  ASSERT_GT(proc.port, 0);
  ThreadPool pool(2);
  SchedulerOptions o;
  o.block_size = 8;
  o.kv_blocks = 96;
  o.n_ctx = 512;
  const auto p = Prompt(200, 29);
  {
    auto ba = BridgeTo({proc.Addr()});
    ASSERT_TRUE(ba);
    SchedulerOptions oa = o;
    oa.store = ba.get();
    auto a = Make(pool, oa);
    RunAll(*a, {Greedy(p, 2)});
    ba->Drain();
    ASSERT_GT(ba->stats().published_blocks, 0u);
  }
  // Reads the first half of the fetch, kills the store, then reads the rest.
  std::atomic<int> killed{0};
  auto bb = BridgeTo({proc.Addr()}, 2000ms,
                     [&](store::StoreClient& client, const store::LookupResult& found, size_t first, size_t from, size_t to,
                         const StoreFetch& f, net::Deadline deadline, store::GetReceipt* receipt) -> Status {
                       const size_t half = from + (to - from) / 2;
                       std::vector<void*> head(f.dst.begin() + static_cast<ptrdiff_t>(from), f.dst.begin() + static_cast<ptrdiff_t>(half));
                       std::vector<void*> rest(f.dst.begin() + static_cast<ptrdiff_t>(half), f.dst.begin() + static_cast<ptrdiff_t>(to));
                       const store::ByteRange all{f.local.offset, f.local.bytes};
                       TRELLIS_RETURN_IF_ERROR(client.GetRange(found, first, half - from, head, f.block_bytes, deadline, receipt, all));
                       if (killed++ == 0) proc.Kill();
                       return client.GetRange(found, first + (half - from), to - half, rest, f.block_bytes, deadline, receipt, all);
                     });
  ASSERT_TRUE(bb);
  SchedulerOptions ob = o;
  ob.store = bb.get();
  auto b = Make(pool, ob);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = RunAll(*b, {Greedy(p, 4)});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, TestScaled(std::chrono::seconds(4)));
  ASSERT_GT(killed.load(), 0) << "the fetch never read its first half";
  const CacheReceipt& c = got[0].result.cache;
  EXPECT_EQ(c.store, 0);
  EXPECT_EQ(c.computed, static_cast<int>(p.size()));
  EXPECT_GT(c.misses[static_cast<int>(StoreMiss::kDown)] + c.misses[static_cast<int>(StoreMiss::kDeadline)], 0);
  const Outcome want = Cold(pool, o, Greedy(p, 4));
  ExpectSameOutput(got[0], want, "the store killed mid-fetch");
  const auto again = RunAll(*b, {Greedy(p, 4)});
  ExpectSameOutput(again[0], want, "the same prompt again, from the local cache");
  EXPECT_GT(again[0].result.cache.local, 0);
  EXPECT_EQ(b->cache().CheckInvariants(), "");
  bb->Drain();
  EXPECT_EQ(bb->stats().fetched_blocks, 0u) << "the half that landed counted as fetched";
}

}  // namespace
}  // namespace trellis
