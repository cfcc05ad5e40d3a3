// The grid over the real transport (UCX on loopback), nodes in this process: a head and
// nodes give the whole model's tokens and logits, with micro-batches in flight; a node
// with another model or other layers is refused at connect; a node that dies fails the
// requests in flight with Unavailable and marks the head unhealthy, and once restarted it
// rejoins and the grid serves correct answers again. (tests/grid/grid_processes.sh runs
// the same with real processes.)
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "engine/kv_layout.h"
#include "engine/scheduler.h"
#include "engine/test_models.h"
#include "engine/test_scheduler.h"
#include "grid/head.h"
#include "grid/prefix_store.h"
#include "grid/node.h"
#include "grid/protocol.h"
#include "store/server.h"
#include "util/slowdown.h"

namespace trellis::grid {
namespace {

using trellis::testing::Greedy;
using trellis::testing::RunAll;

const std::string& ModelPath() {
  static const std::string p = trellis::testing::WriteSmallModel("grid_q4_0.gguf", "q4_0");
  return p;
}
const std::string& OtherModelPath() {  // same shape, other weights
  static const std::string p = trellis::testing::WriteSmallModel("grid_other_f32.gguf", "f32");
  return p;
}

std::unique_ptr<Model> Load(const std::string& path, ModelPart part) {
  auto r = Model::Load(path, part);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// The in-process tests run on the in-memory transport (TransportOptions::loopback); tests
// with another process (a `trellis store`, a forked child) on UCX over lo.
bool g_ucx = false;
struct UcxForThisTest {
  UcxForThisTest() { g_ucx = true; }
  ~UcxForThisTest() { g_ucx = false; }
};

net::TransportOptions Lo() {
  net::TransportOptions t;
  t.net_devices = "lo";
  t.loopback = !g_ucx;
  t.spin_us = 0;
  return t;
}

struct TestNode {
  std::unique_ptr<Model> model;
  std::unique_ptr<GridNode> node;
};

TestNode StartNode(const std::string& path, int first, int last, uint16_t port = 0, uint64_t max_kv_bytes = 0,
                   const std::string& store = "", int64_t kv_types = -1) {
  TestNode n;
  n.model = Load(path, ModelPart{.first_layer = first, .last_layer = last, .embed = false, .head = false});
  NodeOptions o;
  o.kv_types = kv_types;
  o.port = port;
  o.max_kv_bytes = max_kv_bytes;
  o.transport = Lo();
  if (!store.empty()) {
    o.store.servers = {store};
    o.store.local = store;
    o.store.transport = Lo();
  }
  auto r = GridNode::Start(*n.model, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) n.node = std::move(r).value();
  return n;
}

std::vector<Request> Workload(int n, int seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> shared(45);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 1000) + 3;
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + 12 + 7 * i);
    for (int k = 0; k < 2 + i; ++k) p.push_back(static_cast<int32_t>(rng() % 1000) + 3);
    reqs.push_back(Greedy(p, 10 + i));
  }
  return reqs;
}

// Every request's tokens and logits are the whole model's; with may_fail, a request may
// instead have failed cleanly, Unavailable naming a grid node (never another error, never
// a wrong answer).
void ExpectSameAsWhole(const std::vector<Request>& reqs, const std::vector<trellis::testing::Outcome>& got,
                       const std::string& what, bool may_fail = false) {
  static std::unique_ptr<Model> whole = Load(ModelPath(), {});
  ThreadPool threads(1);
  SchedulerOptions o;
  o.block_size = 8;
  o.n_ctx = 256;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto s = Scheduler::Create(*whole, o, threads);
    ASSERT_TRUE(s.ok());
    auto ref = RunAll(**s, {reqs[i]});
    if (may_fail && got[i].result.reason == FinishReason::kError) {
      EXPECT_EQ(got[i].result.error.code(), StatusCode::kUnavailable) << what << ": " << got[i].result.error.ToString();
      EXPECT_NE(got[i].result.error.message().find("grid node"), std::string::npos) << got[i].result.error.ToString();
      continue;
    }
    ASSERT_EQ(got[i].result.reason, FinishReason::kLength) << what << ": " << got[i].result.error.ToString();
    EXPECT_EQ(got[i].tokens, ref[0].tokens) << what << " request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[0].logits.size());
    for (size_t k = 0; k < ref[0].logits.size(); ++k) {
      EXPECT_LT(trellis::testing::MaxRelDiff(got[i].logits[k], ref[0].logits[k]), 1e-4) << what << " request " << i << " step " << k;
    }
  }
}

struct Grid {
  std::unique_ptr<Model> head_model;
  GridHead* head = nullptr;
  std::unique_ptr<Scheduler> sched;
};

Result<Grid> StartHead(int head_layers, const std::vector<NodeAddress>& nodes, ThreadPool& threads, int depth,
                       int prefill_chunk = 16, size_t max_message_bytes = 0, PrefixStore* store = nullptr) {
  Grid g;
  g.head_model = Load(ModelPath(), ModelPart{.first_layer = 0, .last_layer = head_layers, .embed = true, .head = true});
  HeadOptions ho;
  ho.nodes = nodes;
  ho.transport = Lo();
  if (max_message_bytes) ho.transport.max_message_bytes = max_message_bytes;
  ho.depth = depth;
  ho.start_timeout = std::chrono::milliseconds(3000);
  ho.step_timeout = std::chrono::milliseconds(5000);
  ho.retry_interval = std::chrono::milliseconds(100);
  ho.store = store != nullptr;
  SchedulerOptions o;
  o.store = store;
  o.block_size = 8;
  o.n_ctx = 256;
  o.kv_blocks = 96;
  o.prefill_chunk = prefill_chunk;
  o.executor = MakeGridExecutor(*g.head_model, ho, &g.head, dynamic_cast<GridPrefixStore*>(store));
  TRELLIS_ASSIGN_OR_RETURN(g.sched, Scheduler::Create(*g.head_model, o, threads));
  return g;
}

NodeAddress Addr(const TestNode& n, int first, int last) {
  return NodeAddress{"127.0.0.1", n.node->port(), first, last};
}

struct GridCase {
  int head_layers;
  int depth;
};
class GridTest : public ::testing::TestWithParam<GridCase> {};

TEST_P(GridTest, SameTokensAndLogitsAsTheWholeModel) {
  const GridCase gc = GetParam();
  std::vector<TestNode> nodes;
  std::vector<NodeAddress> addrs;
  for (int l = gc.head_layers; l < 2; ++l) {
    nodes.push_back(StartNode(ModelPath(), l, l + 1));
    ASSERT_TRUE(nodes.back().node);
    addrs.push_back(Addr(nodes.back(), l, l + 1));
  }
  ThreadPool threads(1);
  auto g = StartHead(gc.head_layers, addrs, threads, gc.depth);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (int wave = 0; wave < 2; ++wave) {  // the second wave reuses the first's cache
    const auto reqs = Workload(4, 7 + wave);
    auto got = RunAll(*g->sched, reqs);
    ExpectSameAsWhole(reqs, got, "wave " + std::to_string(wave));
  }
  EXPECT_GT(g->sched->metrics().cached_tokens, 0);
  const HeadStats hs = g->head->stats();
  EXPECT_GT(hs.steps, 0u);
  EXPECT_GT(hs.bytes_sent, 0u);
  for (const TestNode& n : nodes) EXPECT_EQ(n.node->stats().refused_steps, 0u);
  EXPECT_TRUE(g->head->health().ok);
}

INSTANTIATE_TEST_SUITE_P(Grids, GridTest,
                         ::testing::Values(GridCase{1, 1}, GridCase{1, 2}, GridCase{0, 2}, GridCase{0, 3}),
                         [](const ::testing::TestParamInfo<GridCase>& i) {
                           return std::to_string(2 - i.param.head_layers) + "nodes_depth" + std::to_string(i.param.depth);
                         });

TEST(GridHeadTest, ANodeWithAnotherModelOrOtherLayersIsRefused) {
  ThreadPool threads(1);
  {
    TestNode other = StartNode(OtherModelPath(), 1, 2);
    ASSERT_TRUE(other.node);
    auto g = StartHead(1, {Addr(other, 1, 2)}, threads, 2);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("refused"), std::string::npos) << g.status().ToString();
    EXPECT_NE(g.status().message().find("model"), std::string::npos) << g.status().ToString();
    EXPECT_EQ(other.node->stats().refused_hellos, 1u);
  }
  {
    // The node holds layers 0-1; the head expects it to hold layer 1 only.
    TestNode wide = StartNode(ModelPath(), 0, 2);
    ASSERT_TRUE(wide.node);
    auto g = StartHead(1, {Addr(wide, 1, 2)}, threads, 2);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("layers"), std::string::npos) << g.status().ToString();
  }
  {
    // A node started with -ctk q8_0 -ctv q8_0 does not take a head keeping f16.
    TestNode q8 = StartNode(ModelPath(), 1, 2, 0, 0, "", KvLayout{0, 0, 0, 0, KvType::kQ8_0, KvType::kQ8_0}.TypeCode());
    ASSERT_TRUE(q8.node);
    auto g = StartHead(1, {Addr(q8, 1, 2)}, threads, 2);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("-ctk q8_0 -ctv q8_0"), std::string::npos) << g.status().ToString();
    EXPECT_EQ(q8.node->stats().refused_hellos, 1u);
  }
  {
    // Nobody listening: a clear error once the start timeout passes.
    TestNode gone = StartNode(ModelPath(), 1, 2);
    const uint16_t port = gone.node->port();
    gone.node.reset();
    auto g = StartHead(1, {NodeAddress{"127.0.0.1", port, 1, 2}}, threads, 2);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kUnavailable) << g.status().ToString();
  }
}

// What a head may ask of a node is bounded: a pool past the node's limit is refused at
// Hello (and the node serves a head that asks for less); a step that would not fit the
// transport's messages is refused when the head is made, not found out per request.
TEST(GridHeadTest, OversizedPoolsAndStepsAreRefusedUpFront) {
  ThreadPool threads(1);
  TestNode small = StartNode(ModelPath(), 1, 2, 0, /*max_kv_bytes=*/64 << 10);
  ASSERT_TRUE(small.node);
  auto g = StartHead(1, {Addr(small, 1, 2)}, threads, 2);  // 96 blocks of 8 tokens: 96 KiB of KV for layer 1
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("KV pool"), std::string::npos) << g.status().ToString();
  EXPECT_EQ(small.node->stats().refused_hellos, 1u);
  TestNode roomy = StartNode(ModelPath(), 1, 2, 0, /*max_kv_bytes=*/1 << 20);
  ASSERT_TRUE(roomy.node);
  auto ok = StartHead(1, {Addr(roomy, 1, 2)}, threads, 2);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  auto out = RunAll(*ok->sched, Workload(1, 5));
  ExpectSameAsWhole(Workload(1, 5), out, "a node within its limit");
  // 32-token steps of 64 floats are 8 KiB of hidden state: more than 16 KiB messages hold
  // once the 2 MiB left for tables is counted.
  auto big = StartHead(1, {Addr(roomy, 1, 2)}, threads, 2, 16, /*max_message_bytes=*/16 << 10);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("exceeds the transport"), std::string::npos) << big.status().ToString();
}

// A node serves the connection its accepted Hello came on: a step on any other (an
// older connection of the same head, a stranger) is refused, and nothing queued before
// a Hello runs after it.
TEST(GridNodeTest, StepsFromAnotherConnectionAreRefused) {
  TestNode n = StartNode(ModelPath(), 1, 2);
  ASSERT_TRUE(n.node);
  auto t = net::Transport::Create(Lo());
  ASSERT_TRUE(t.ok());
  net::Transport& tr = **t;
  auto call = [&](net::ConnId c, uint16_t type, std::string body) {
    std::promise<Result<std::string>> p;
    auto f = p.get_future();
    tr.Post([&] { tr.Call(c, type, std::move(body), net::After(std::chrono::milliseconds(5000)), [&](Result<std::string> r) { p.set_value(std::move(r)); }); });
    return f.get();
  };
  const auto a = tr.Sync([&] { return tr.Connect("127.0.0.1", n.node->port()); });
  const auto b = tr.Sync([&] { return tr.Connect("127.0.0.1", n.node->port()); });
  ASSERT_TRUE(a.ok() && b.ok());
  HelloRequest h;
  h.head_id = 42;
  h.fingerprint = n.model->fingerprint();
  h.n_layer = 2;
  h.first_layer = 1;
  h.last_layer = 2;
  h.block_size = 8;
  h.n_blocks = 16;
  h.max_batch_tokens = 32;
  h.max_seqs = 4;
  h.n_ctx = 128;
  ASSERT_TRUE(call(*a, kHello, EncodeHello(h)).ok());
  const uint32_t E = static_cast<uint32_t>(n.model->config().n_embd);
  auto step = [&](uint64_t seq) {
    const StepSeq q{0, 4, {1}};
    return EncodeStepHeader(42, seq) + EncodeStepPrefix({}, std::span<const StepSeq>(&q, 1)) + std::string(4 * E * 4, '\0');
  };
  auto on_a = call(*a, kStep, step(1));
  ASSERT_TRUE(on_a.ok()) << on_a.status().ToString();
  EXPECT_EQ(on_a->size(), 4u * E * 4);
  // The same head id on another connection: refused.
  auto on_b = call(*b, kStep, step(2));
  ASSERT_FALSE(on_b.ok());
  EXPECT_NE(on_b.status().message().find("connection"), std::string::npos) << on_b.status().ToString();
  // After a Hello on b, a's steps are refused and b's count from 1.
  ASSERT_TRUE(call(*b, kHello, EncodeHello(h)).ok());
  EXPECT_FALSE(call(*a, kStep, step(2)).ok());
  EXPECT_TRUE(call(*b, kStep, step(1)).ok());
  tr.Stop();
}

TEST(GridHeadTest, ADeadNodeFailsRequestsAndARestartedOneRejoins) {
  ThreadPool threads(1);
  TestNode n1 = StartNode(ModelPath(), 0, 1);
  TestNode n2 = StartNode(ModelPath(), 1, 2);
  ASSERT_TRUE(n1.node && n2.node);
  const uint16_t port2 = n2.node->port();
  auto g = StartHead(0, {Addr(n1, 0, 1), Addr(n2, 1, 2)}, threads, 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto warm = RunAll(*g->sched, Workload(2, 3));
  ExpectSameAsWhole(Workload(2, 3), warm, "before the failure");

  // Node 2 dies while requests run.
  std::vector<RequestResult> results(3);
  for (int i = 0; i < 3; ++i) {
    auto id = g->sched->Submit(Greedy(std::vector<int32_t>(40, 9 + i), 200, false), nullptr,
                               [&results, i](RequestId, const RequestResult& r) { results[static_cast<size_t>(i)] = r; });
    ASSERT_TRUE(id.ok());
  }
  for (int i = 0; i < 6; ++i) g->sched->Step();
  n2.node.reset();
  g->sched->RunUntilIdle();
  for (const RequestResult& r : results) {
    EXPECT_EQ(r.reason, FinishReason::kError);
    EXPECT_EQ(r.error.code(), StatusCode::kUnavailable) << r.error.ToString();
    EXPECT_NE(r.error.message().find("grid node"), std::string::npos) << r.error.ToString();
  }
  const HeadHealth h = g->head->health();
  EXPECT_FALSE(h.ok);
  EXPECT_NE(h.message.find(std::to_string(port2)), std::string::npos) << h.message;
  // While it is down, a request fails at once with the same reason.
  auto down = RunAll(*g->sched, {Greedy({5, 6, 7}, 4, false)});
  EXPECT_EQ(down[0].result.reason, FinishReason::kError);
  EXPECT_EQ(down[0].result.error.code(), StatusCode::kUnavailable);

  // Restarted on the same port: the head reconnects by itself and serves again, with the
  // cache it held before dropped (node 2's K/V is gone).
  n2 = StartNode(ModelPath(), 1, 2, port2);
  ASSERT_TRUE(n2.node);
  const auto rejoin_by = std::chrono::steady_clock::now() + TestScaled(std::chrono::seconds(5));
  while (!g->head->health().ok && std::chrono::steady_clock::now() < rejoin_by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(g->head->health().ok) << g->head->health().message;
  const auto reqs = Workload(2, 3);  // the same prompts as before: a stale cache would be wrong
  auto after = RunAll(*g->sched, reqs);
  ExpectSameAsWhole(reqs, after, "after the rejoin");
  // The cache view's grid section: each node's steps, step time and failures.
  const HeadStats st = g->head->stats();
  EXPECT_EQ(st.rejoins, 1u);
  ASSERT_EQ(st.nodes.size(), 2u);
  EXPECT_EQ(st.nodes[1].address, "127.0.0.1:" + std::to_string(port2));
  EXPECT_EQ(st.nodes[0].first_layer, 0);
  EXPECT_EQ(st.nodes[1].last_layer, 2);
  for (const HeadStats::Node& n : st.nodes) {
    EXPECT_TRUE(n.up) << n.address;
    EXPECT_GT(n.steps, 0u) << n.address;
    EXPECT_GT(n.step_seconds, 0.0) << n.address;
  }
  EXPECT_EQ(st.nodes[0].failures, 0u);
  EXPECT_EQ(st.nodes[1].failures, 1u);
  EXPECT_EQ(st.node_failures, 1u);
}

// A partial-match copy made while a node is down (its request then fails at Launch) is
// queued for the next step; when the node rejoins, that step belongs to a new epoch whose
// blocks the scheduler gives to other sessions. The queued copy must be dropped, never
// sent: carried to the nodes with the first step after the rejoin it overwrote slots of a
// block that a new session's store fetch, or its own compute, had filled (the wrong grid
// answers the chaos run saw after node faults).
TEST(GridHeadTest, SlotCopiesQueuedBeforeANodeFailedAreNeverSentAfterItRejoins) {
  ThreadPool threads(1);
  TestNode n1 = StartNode(ModelPath(), 0, 1);
  TestNode n2 = StartNode(ModelPath(), 1, 2);
  ASSERT_TRUE(n1.node && n2.node);
  const uint16_t port2 = n2.node->port();
  auto g = StartHead(0, {Addr(n1, 0, 1), Addr(n2, 1, 2)}, threads, 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24};
  auto warm = RunAll(*g->sched, {Greedy(prompt, 12)});  // 26 tokens: 3 whole blocks of 8 cached
  ASSERT_EQ(warm[0].result.reason, FinishReason::kLength);

  n2.node.reset();
  // The head notices at its next step (or from the closed connection).
  RunAll(*g->sched, {Greedy({5, 6, 7}, 2, false)});
  const auto down_by = std::chrono::steady_clock::now() + TestScaled(std::chrono::seconds(5));
  while (g->head->health().ok && std::chrono::steady_clock::now() < down_by) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_FALSE(g->head->health().ok);
  // A prompt that shares the first block whole and 4 slots of the second: admitted with a
  // copy of those slots, which cannot be sent (the node is down).
  const int64_t copies_before = g->sched->metrics().partial_copies;
  std::vector<int32_t> partial(prompt.begin(), prompt.begin() + 12);
  partial.insert(partial.end(), {901, 902, 903});
  auto failed = RunAll(*g->sched, {Greedy(partial, 4, false)});
  EXPECT_EQ(failed[0].result.reason, FinishReason::kError);
  ASSERT_EQ(g->sched->metrics().partial_copies, copies_before + 1) << "no partial-match copy was made";
  const uint64_t sent_before = g->head->stats().copies_sent;

  n2 = StartNode(ModelPath(), 1, 2, port2);
  ASSERT_TRUE(n2.node);
  const auto rejoin_by = std::chrono::steady_clock::now() + TestScaled(std::chrono::seconds(5));
  while (!g->head->health().ok && std::chrono::steady_clock::now() < rejoin_by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(g->head->health().ok) << g->head->health().message;
  // Prompts that share nothing (not even a first token), so none of them copies slots.
  const std::vector<Request> reqs = {Greedy({31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41}, 10),
                                     Greedy({51, 52, 53, 54, 55, 56, 57, 58, 59}, 10), Greedy(prompt, 10)};
  auto after = RunAll(*g->sched, reqs);
  ExpectSameAsWhole(reqs, after, "after the rejoin");
  const HeadStats st = g->head->stats();
  EXPECT_EQ(st.copies_dropped, 1u);
  // The cache was cleared with the epoch: nothing the new requests did needed a copy, so
  // any copy sent now is the stale one.
  EXPECT_EQ(st.copies_sent, sent_before) << "a copy queued on the old epoch was sent on the new one";
}

// Against llama.cpp: the reference models (tests/data/reference) split over 2 and 3 nodes,
// teacher-forced on llama.cpp's greedy tokens: every decode step's logits within the
// model's rms/std bound of llama.cpp's (tests/data/README.md), the same bound the whole
// model meets in reference_test.
struct RefCase {
  std::string model;  // file stem
  int n_layer;
  int head_layers;    // the nodes take one layer each after these
  std::string kv = "";  // K/V types "K-V" (reference_test.cc's Case::kv); empty: f16
  std::string Name() const { return kv.empty() ? model : model + ".kv-" + kv; }
};
class GridReferenceTest : public ::testing::TestWithParam<RefCase> {};

TEST_P(GridReferenceTest, DecodeLogitsMatchLlamaCpp) {
  const RefCase rc = GetParam();
  const std::string dir = std::string(TRELLIS_TEST_DATA) + "/reference/";
  const std::string path = trellis::testing::ReferenceModelPath(rc.model);
  ASSERT_FALSE(path.empty());
  const nlohmann::json tol = nlohmann::json::parse(std::ifstream(dir + "tolerances.json"));
  const double bound = tol[rc.Name()][0];
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(dir + rc.Name() + ".p67.json"));
  const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
  const auto greedy = ref["greedy"].get<std::vector<int32_t>>();
  std::ifstream lf(dir + rc.Name() + ".p67.decode_logits.f32", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(lf)), std::istreambuf_iterator<char>());
  std::vector<float> want(raw.size() / 4);
  std::memcpy(want.data(), raw.data(), want.size() * 4);

  std::vector<TestNode> nodes;
  std::vector<NodeAddress> addrs;
  for (int l = rc.head_layers; l < rc.n_layer; ++l) {
    nodes.push_back(StartNode(path, l, l + 1));
    ASSERT_TRUE(nodes.back().node);
    addrs.push_back(Addr(nodes.back(), l, l + 1));
  }
  auto head_model = Load(path, ModelPart{.first_layer = 0, .last_layer = rc.head_layers, .embed = true, .head = true});
  ASSERT_TRUE(head_model);
  HeadOptions ho;
  ho.nodes = addrs;
  ho.transport = Lo();
  ho.depth = 2;
  ThreadPool threads(2);
  SchedulerOptions o;
  o.block_size = 16;  // decode crosses block boundaries within the 32 steps
  o.prefill_chunk = 24;
  if (!rc.kv.empty()) {
    ASSERT_TRUE(ParseKvType(rc.kv.substr(0, rc.kv.find('-')), &o.kv_type_k));
    ASSERT_TRUE(ParseKvType(rc.kv.substr(rc.kv.find('-') + 1), &o.kv_type_v));
  }
  o.executor = MakeGridExecutor(*head_model, ho);
  auto sched = Scheduler::Create(*head_model, o, threads);
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  Request r = Greedy(prompt, static_cast<int>(greedy.size()));
  r.force_tokens = greedy;
  // Two more sessions share the batches (and the first's prefix): batch invariance.
  Request other = Greedy(std::vector<int32_t>(prompt.begin(), prompt.begin() + 40), 20, false);
  auto out = RunAll(**sched, {r, other, other});
  ASSERT_EQ(out[0].logits.size(), greedy.size());
  const size_t n_vocab = out[0].logits[0].size();
  ASSERT_EQ(want.size(), greedy.size() * n_vocab);
  // on_token's logits for generated token k + 1 are those after feeding greedy[k]:
  // llama.cpp's decode row k.
  double worst = 0;
  for (size_t k = 0; k + 1 < greedy.size(); ++k) {
    const float* a = out[0].logits[k + 1].data();
    const float* b = want.data() + k * n_vocab;
    double mean = 0, d2 = 0, var = 0;
    for (size_t i = 0; i < n_vocab; ++i) mean += b[i];
    mean /= static_cast<double>(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) {
      ASSERT_TRUE(std::isfinite(a[i])) << "step " << k;
      d2 += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      var += (b[i] - mean) * (b[i] - mean);
    }
    worst = std::max(worst, std::sqrt(d2 / var));
  }
  EXPECT_LT(worst, bound);
  std::printf("[ref-grid] %s over %zu nodes (head runs %d layers): worst rms/std %.5f over %zu decode steps (bound %.3f)\n",
              rc.Name().c_str(), nodes.size(), rc.head_layers, worst, greedy.size() - 1, bound);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, GridReferenceTest,
                         ::testing::Values(RefCase{"ref-a-q4_0", 2, 0}, RefCase{"ref-a-f16", 2, 1},
                                           RefCase{"ref-b-q6_k", 3, 0}, RefCase{"ref-b-q6_k", 3, 1},
                                           // Mixtures: a node holds whole layers, experts included.
                                           RefCase{"ref-qwen3moe-f16", 2, 0}, RefCase{"ref-mixtral-q8_0", 2, 1},
                                           // Quantized K/V: the nodes build their pools in the head's types.
                                           RefCase{"ref-a-f16", 2, 0, "q8_0-q4_0"}),
                         [](const ::testing::TestParamInfo<RefCase>& i) {
                           std::string n = i.param.Name() + "_" + std::to_string(i.param.n_layer - i.param.head_layers) + "nodes";
                           for (char& c : n) c = (c == '-' || c == '.') ? '_' : c;
                           return n;
                         });

// The store (docs/grid.md, "The store"): a grid publishes whole blocks (its nodes' layers
// gathered), and a later grid, with empty pools, has each node read its layers' range of
// them straight into its pool while the head reads its own; its answers are the whole
// model's. The blocks are the store's usual ones: a single-process engine reads what a
// grid published, and a grid what a single-process engine published.
class GridStoreTest : public ::testing::TestWithParam<int> {};

// The store of a grid head (GridPrefixStore: its nodes read and gather their layers) or,
// for a single process, the plain bridge.
std::unique_ptr<PrefixStore> GridBridge(const store::StoreServer& s, bool grid) {
  StoreBridgeOptions o;
  o.client.servers = {"127.0.0.1:" + std::to_string(s.port())};
  o.client.local = o.client.servers[0];
  o.client.transport = Lo();
  o.fetch_timeout = std::chrono::milliseconds(3000);
  o.publish_timeout = std::chrono::milliseconds(3000);
  if (grid) {
    auto g = GridPrefixStore::Connect(o);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return g.ok() ? std::move(g).value() : nullptr;
  }
  auto b = StoreBridge::Connect(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

std::unique_ptr<store::StoreServer> GridStoreServer() {
  store::ServerOptions so;
  so.mem_bytes = 16 << 20;
  so.transport = Lo();
  auto s = store::StoreServer::Start(so);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// Runs reqs on a fresh grid with the store; returns the outcomes and the scheduler's
// metrics after its publishes completed.
std::pair<std::vector<trellis::testing::Outcome>, SchedulerMetrics> RunGridWithStore(
    int head_layers, const std::vector<NodeAddress>& addrs, const store::StoreServer& s, const std::vector<Request>& reqs,
    HeadStats* head_stats = nullptr) {
  ThreadPool threads(1);
  auto bridge = GridBridge(s, true);
  EXPECT_TRUE(bridge && bridge->handles_layer_split());
  auto g = StartHead(head_layers, addrs, threads, 2, 16, 0, bridge.get());
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return {};
  auto out = RunAll(*g->sched, reqs);
  bridge->Drain();
  g->sched->RunUntilIdle();
  SchedulerMetrics m = g->sched->metrics();
  if (head_stats) *head_stats = g->head->stats();
  g->sched.reset();
  return {out, m};
}

std::pair<std::vector<trellis::testing::Outcome>, SchedulerMetrics> RunWholeWithStore(const store::StoreServer& s,
                                                                                     const std::vector<Request>& reqs) {
  static std::unique_ptr<Model> whole = Load(ModelPath(), {});
  ThreadPool threads(1);
  auto bridge = GridBridge(s, false);
  SchedulerOptions o;
  o.block_size = 8;
  o.n_ctx = 256;
  o.store = bridge.get();
  auto sched = Scheduler::Create(*whole, o, threads);
  EXPECT_TRUE(sched.ok()) << sched.status().ToString();
  auto out = RunAll(**sched, reqs);
  bridge->Drain();
  (*sched)->RunUntilIdle();
  return {out, (*sched)->metrics()};
}

TEST_P(GridStoreTest, NodesReadTheirLayersOfStoredPrefixesAndAnswersAreTheWholeModels) {
  const int head_layers = GetParam();
  auto s = GridStoreServer();
  ASSERT_TRUE(s);
  const std::string addr = "127.0.0.1:" + std::to_string(s->port());
  std::vector<TestNode> nodes;
  std::vector<NodeAddress> addrs;
  for (int l = head_layers; l < 2; ++l) {
    nodes.push_back(StartNode(ModelPath(), l, l + 1, 0, 0, addr));
    ASSERT_TRUE(nodes.back().node);
    addrs.push_back(Addr(nodes.back(), l, l + 1));
  }
  // 1. A grid computes and publishes.
  const auto reqs = Workload(3, 21);
  HeadStats hs;
  auto [first, m1] = RunGridWithStore(head_layers, addrs, *s, reqs, &hs);
  ExpectSameAsWhole(reqs, first, "grid, publishing");
  EXPECT_GT(m1.store_published_blocks, 0);
  EXPECT_EQ(m1.store_publish_failures, 0);
  EXPECT_GT(hs.gathered_bytes, 0u);
  // 2. A new grid (the nodes' pools start over) reads the prefixes: every node its layers.
  std::vector<uint64_t> fetched_before;
  for (const TestNode& n : nodes) fetched_before.push_back(n.node->stats().fetched_blocks);
  auto [second, m2] = RunGridWithStore(head_layers, addrs, *s, reqs);
  ExpectSameAsWhole(reqs, second, "grid, reading the store");
  EXPECT_GT(m2.store_tokens, 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_GT(nodes[i].node->stats().fetched_blocks, fetched_before[i]) << "node " << i;
    EXPECT_EQ(nodes[i].node->stats().fetch_failures, 0u) << "node " << i;
  }
  // 3. A single-process engine reads what the grid published.
  auto [third, m3] = RunWholeWithStore(*s, reqs);
  ExpectSameAsWhole(reqs, third, "one process, reading the grid's blocks");
  EXPECT_GT(m3.store_tokens, 0);
  // 4. And a grid reads what a single-process engine published.
  const auto other = Workload(2, 99);
  auto [fourth, m4] = RunWholeWithStore(*s, other);
  EXPECT_GT(m4.store_published_blocks, 0);
  auto [fifth, m5] = RunGridWithStore(head_layers, addrs, *s, other);
  ExpectSameAsWhole(other, fifth, "grid, reading one process's blocks");
  EXPECT_GT(m5.store_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Grids, GridStoreTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(2 - i.param) + "nodes"; });

// A byte flipped in the store inside one node's layers fails that node's checked read: the
// fetch is a checksum miss, the prompt is computed, and the answers stay the whole
// model's. A head whose nodes have no store is refused at start-up.
TEST(GridStoreTest2, ACorruptedLayerSliceIsAMissAndANodeWithoutAStoreIsRefused) {
  auto s = GridStoreServer();
  ASSERT_TRUE(s);
  const std::string addr = "127.0.0.1:" + std::to_string(s->port());
  TestNode n = StartNode(ModelPath(), 1, 2, 0, 0, addr);
  ASSERT_TRUE(n.node);
  const std::vector<NodeAddress> addrs = {Addr(n, 1, 2)};
  const auto reqs = Workload(1, 5);
  auto [first, m1] = RunWholeWithStore(*s, reqs);
  ASSERT_GT(m1.store_published_blocks, 0);
  // The stored tensor's first block, a byte inside layer 1's half (the node's).
  store::StoreServer& server = *s;
  bool flipped = false;
  for (uint64_t tensor : server.TensorIdsForTesting()) {
    const uint64_t block_bytes = KvLayoutFor(n.model->config(), 8).BlockBytes();
    flipped |= server.CorruptByteForTesting(tensor, block_bytes / 2 + 5);
  }
  ASSERT_TRUE(flipped);
  auto [second, m2] = RunGridWithStore(1, addrs, *s, reqs);
  ExpectSameAsWhole(reqs, second, "grid, after a corrupted slice");
  EXPECT_EQ(m2.store_tokens, 0);
  EXPECT_GT(m2.store_miss_tokens[static_cast<int>(StoreMiss::kChecksum)], 0);
  EXPECT_GT(n.node->stats().fetch_failures, 0u);
  // Without a store on the node.
  TestNode bare = StartNode(ModelPath(), 1, 2);
  ASSERT_TRUE(bare.node);
  ThreadPool threads(1);
  auto bridge = GridBridge(*s, true);
  auto g = StartHead(1, {Addr(bare, 1, 2)}, threads, 2, 16, 0, bridge.get());
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("--store"), std::string::npos) << g.status().ToString();
}

// A grid node as a child process (this binary re-executed as GridChild.Node), so that a
// test can have it SIGKILLed at an exact point of its work: die_at "fetch-landed" kills it
// as the first segment of a store fetch lands in its pool, "read" as it answers a publish
// read (GridNode::SetFaultHookForTesting); "" never.
struct NodeProcess {
  pid_t pid = -1;
  uint16_t port = 0;
  NodeProcess(int first, int last, uint16_t want_port, const std::string& store, const std::string& die_at) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe");
    const std::string spec = fmt::format("{} {} {} {} {} {}", ModelPath(), first, last, want_port, store, die_at.empty() ? "-" : die_at);
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      setenv("TRELLIS_GRID_CHILD_NODE", spec.c_str(), 1);
      execl(self.c_str(), self.c_str(), "--gtest_filter=GridChild.Node", nullptr);
      _exit(127);
    }
    close(fds[1]);
    out = fdopen(fds[0], "r");
    char line[256];
    while (out && std::fgets(line, sizeof line, out)) {
      if (std::sscanf(line, "node port %hu", &port) == 1) break;
    }
  }
  // Whether the child ended by SIGKILL (its hook ran) within `within`; kills it if not.
  bool DiedOfSigkill(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        Kill();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid = -1;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }
  void Kill() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~NodeProcess() {
    Kill();
    if (out) std::fclose(out);
  }
  FILE* out = nullptr;
};

TEST(GridChild, Node) {
  UcxForThisTest ucx;
  const char* spec = getenv("TRELLIS_GRID_CHILD_NODE");
  if (!spec) GTEST_SKIP() << "only as the child of a test that kills grid nodes (NodeProcess)";
  std::istringstream in(spec);
  std::string path, store, die_at;
  int first = 0, last = 0;
  uint16_t port = 0;
  in >> path >> first >> last >> port >> store >> die_at;
  TestNode n = StartNode(path, first, last, port, 0, store);
  ASSERT_TRUE(n.node);
  if (die_at != "-") {
    n.node->SetFaultHookForTesting([die_at](std::string_view where) {
      if (where == die_at) raise(SIGKILL);
    });
  }
  std::printf("node port %u\n", static_cast<unsigned>(n.node->port()));
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Waits until the head says it is healthy again (a restarted node rejoined).
bool Rejoined(const GridHead& head) {
  const auto until = std::chrono::steady_clock::now() + TestScaled(std::chrono::seconds(10));
  while (!head.health().ok && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return head.health().ok;
}

// A node SIGKILLed as the first segment of a store fetch lands in its pool: the requests
// in flight fail cleanly (Unavailable) or are right, within the fetch's deadline and
// grace; restarted, the node rejoins the same head, and the same prompts are read from
// the store again with the whole model's answers (nothing the dead fetch half wrote is
// used: the head dropped its cache, the restarted pool is new).
TEST(GridStoreTest2, ANodeKilledDuringAStoreFetchCostsOnlyTheRequestsInFlight) {
  UcxForThisTest ucx;
  auto s = GridStoreServer();
  ASSERT_TRUE(s);
  const std::string addr = "127.0.0.1:" + std::to_string(s->port());
  const auto reqs = Workload(2, 31);
  auto [published, m0] = RunWholeWithStore(*s, reqs);
  ASSERT_GT(m0.store_published_blocks, 0);

  NodeProcess doomed(1, 2, 0, addr, "fetch-landed");
  ASSERT_GT(doomed.port, 0);
  const NodeAddress where{"127.0.0.1", doomed.port, 1, 2};
  ThreadPool threads(1);
  auto bridge = GridBridge(*s, true);
  ASSERT_TRUE(bridge);
  auto g = StartHead(1, {where}, threads, 2, 16, 0, bridge.get());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  auto during = RunAll(*g->sched, reqs);
  // A killed node's connection fails at once: the requests must not wait out the fetch's
  // 3 s deadline (or its grace).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, TestScaled(std::chrono::seconds(3)));
  ASSERT_TRUE(doomed.DiedOfSigkill(std::chrono::seconds(5))) << "the node never reached a fetch's landing";
  ExpectSameAsWhole(reqs, during, "while the node died mid-fetch", /*may_fail=*/true);
  EXPECT_GT(g->head->stats().node_failures, 0u);

  NodeProcess back(1, 2, where.port, addr, "");
  ASSERT_EQ(back.port, where.port);
  ASSERT_TRUE(Rejoined(*g->head)) << g->head->health().message;
  const int64_t store_tokens_before = g->sched->metrics().store_tokens;
  auto after = RunAll(*g->sched, reqs);
  ExpectSameAsWhole(reqs, after, "after the node rejoined");
  EXPECT_GT(g->sched->metrics().store_tokens, store_tokens_before) << "the rejoined node read nothing from the store";
  bridge->Drain();
  g->sched->RunUntilIdle();
}

// A node SIGKILLed as it answers the head's read for a publish: the publish fails and
// stores nothing, the requests fail cleanly or are right; restarted, the node rejoins,
// and what one process then reads from the store is right (a half-gathered block was
// never indexed), as is what the grid computes and publishes after.
TEST(GridStoreTest2, ANodeKilledDuringAPublishReadStoresNothingWrong) {
  UcxForThisTest ucx;
  auto s = GridStoreServer();
  ASSERT_TRUE(s);
  const std::string addr = "127.0.0.1:" + std::to_string(s->port());
  const auto reqs = Workload(2, 47);

  NodeProcess doomed(1, 2, 0, addr, "read");
  ASSERT_GT(doomed.port, 0);
  const NodeAddress where{"127.0.0.1", doomed.port, 1, 2};
  ThreadPool threads(1);
  auto bridge = GridBridge(*s, true);
  ASSERT_TRUE(bridge);
  auto g = StartHead(1, {where}, threads, 2, 16, 0, bridge.get());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto during = RunAll(*g->sched, reqs);
  bridge->Drain();
  g->sched->RunUntilIdle();
  ASSERT_TRUE(doomed.DiedOfSigkill(std::chrono::seconds(5))) << "the node never answered a publish read";
  ExpectSameAsWhole(reqs, during, "while the node died mid-read", /*may_fail=*/true);
  const SchedulerMetrics m1 = g->sched->metrics();
  EXPECT_GT(m1.store_publish_failures, 0);
  EXPECT_EQ(m1.store_published_blocks, 0);

  auto [whole, mw] = RunWholeWithStore(*s, reqs);
  ExpectSameAsWhole(reqs, whole, "one process, reading the store after the failed publish");
  EXPECT_EQ(mw.store_tokens, 0) << "a publish whose read failed left blocks in the store";

  NodeProcess back(1, 2, where.port, addr, "");
  ASSERT_EQ(back.port, where.port);
  ASSERT_TRUE(Rejoined(*g->head)) << g->head->health().message;
  const auto other = Workload(2, 48);
  auto after = RunAll(*g->sched, other);
  ExpectSameAsWhole(other, after, "after the node rejoined");
  bridge->Drain();
  g->sched->RunUntilIdle();
  EXPECT_GT(g->sched->metrics().store_published_blocks, 0);
  auto [again, ma] = RunWholeWithStore(*s, other);
  ExpectSameAsWhole(other, again, "one process, reading what the rejoined grid published");
  EXPECT_GT(ma.store_tokens, 0);
}

TEST(GridProtocolTest, HostileStepsAreRefusedBeforeUse) {
  HelloRequest g;
  g.n_blocks = 10;
  g.block_size = 8;
  g.max_batch_tokens = 64;
  g.max_seqs = 4;
  g.n_ctx = 80;
  const uint32_t E = 4;
  auto body = [&](std::vector<std::array<int32_t, 3>> copies, std::vector<StepSeq> seqs, int extra_rows = 0,
                  int extra_bytes = 0) {
    std::string b = EncodeStepHeader(1, 1) + EncodeStepPrefix(copies, seqs);
    uint32_t rows = 0;
    for (auto& s : seqs) rows += static_cast<uint32_t>(s.n_tokens);
    b += std::string((rows + static_cast<uint32_t>(extra_rows)) * E * 4 + static_cast<uint32_t>(extra_bytes), '\0');
    return b;
  };
  StepRequest out;
  EXPECT_TRUE(DecodeStep(body({}, {StepSeq{0, 8, {3}}}), g, E, out).ok());
  EXPECT_EQ(out.n_rows, 8u);
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{0, 8, {10}}}), g, E, out).ok());        // block id past the pool
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{0, 8, {-1}}}), g, E, out).ok());        // negative id
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{4, 8, {1}}}), g, E, out).ok());         // table too short
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{-4, 2, {1}}}), g, E, out).ok());        // negative position
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{0, 0, {1}}}), g, E, out).ok());         // empty sequence
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{72, 16, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0}}}), g, E, out).ok());  // past n_ctx
  EXPECT_FALSE(DecodeStep(body({{1, 1, 4}}, {StepSeq{0, 1, {1}}}), g, E, out).ok());  // copy onto itself
  EXPECT_FALSE(DecodeStep(body({{1, 2, 9}}, {StepSeq{0, 1, {1}}}), g, E, out).ok());  // more slots than a block
  EXPECT_FALSE(DecodeStep(body({{1, 12, 2}}, {StepSeq{0, 1, {1}}}), g, E, out).ok()); // copy past the pool
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{0, 8, {3}}}, 1), g, E, out).ok());        // hidden state too long
  EXPECT_FALSE(DecodeStep(body({}, {StepSeq{0, 8, {3}}}, 0, -4), g, E, out).ok());    // too short
  std::vector<StepSeq> many(5, StepSeq{0, 1, {1}});
  EXPECT_FALSE(DecodeStep(body({}, many), g, E, out).ok());                           // more sequences than agreed
  std::vector<StepSeq> big(3, StepSeq{0, 30, {0, 1, 2, 3}});
  EXPECT_FALSE(DecodeStep(body({}, big), g, E, out).ok());                            // more tokens than agreed
  // Every truncation of a good step is refused, never read past.
  const std::string good = body({{1, 2, 3}}, {StepSeq{0, 8, {3}}, StepSeq{8, 1, {3, 4}}});
  ASSERT_TRUE(DecodeStep(good, g, E, out).ok());
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(DecodeStep(good.substr(0, n), g, E, out).ok()) << n;
  // A hello out of range is refused.
  HelloRequest h = g;
  h.n_layer = 2;
  h.first_layer = 1;
  h.last_layer = 3;
  HelloRequest back;
  EXPECT_FALSE(DecodeHello(EncodeHello(h), back).ok());
  h.last_layer = 2;
  EXPECT_TRUE(DecodeHello(EncodeHello(h), back).ok());
  // K/V types: known codes pass (and round-trip), others are refused.
  h.kv_types = 0x0102;
  ASSERT_TRUE(DecodeHello(EncodeHello(h), back).ok());
  EXPECT_EQ(back.kv_types, 0x0102u);
  for (uint32_t bad : {0x0003u, 0x0300u, 0x10000u, 0xFFFFFFFFu}) {
    h.kv_types = bad;
    EXPECT_FALSE(DecodeHello(EncodeHello(h), back).ok()) << bad;
  }
}

TEST(GridProtocolTest, HostileFetchesAndReadsAreRefusedBeforeUse) {
  FetchRequest f;
  f.head_id = 7;
  f.deadline_ms = 1000;
  f.block_bytes = 4096;
  f.slices = 4;
  f.found_blocks = 5;
  f.runs = {store::Run{1, 2, 0, 3}, store::Run{1, 3, 0, 2}};
  f.first = 1;
  f.ids = {4, 5, 9};
  FetchRequest out;
  const std::string good = EncodeFetch(f);
  ASSERT_TRUE(DecodeFetch(good, 10, out).ok());
  EXPECT_EQ(out.ids, f.ids);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(DecodeFetch(good.substr(0, n), 10, out).ok()) << n;
  EXPECT_FALSE(DecodeFetch(good + "x", 10, out).ok());
  EXPECT_FALSE(DecodeFetch(good, 9, out).ok());  // block 9 past a pool of 9
  auto bad = [&](auto change) {
    FetchRequest x = f;
    change(x);
    return DecodeFetch(EncodeFetch(x), 10, out).ok();
  };
  EXPECT_FALSE(bad([](FetchRequest& x) { x.ids = {4, -1, 5}; }));
  EXPECT_FALSE(bad([](FetchRequest& x) { x.runs[1].count = 1; }));  // runs do not add up to the prefix
  EXPECT_FALSE(bad([](FetchRequest& x) { x.first = 3; }));          // past the prefix
  EXPECT_FALSE(bad([](FetchRequest& x) { x.ids.clear(); }));
  EXPECT_FALSE(bad([](FetchRequest& x) { x.slices = 3; }));         // does not cut the block
  EXPECT_FALSE(bad([](FetchRequest& x) { x.slices = 0; }));
  EXPECT_FALSE(bad([](FetchRequest& x) { x.deadline_ms = 0; }));
  ReadRequest r;
  r.head_id = 7;
  r.ids = {0, 3};
  ReadRequest rout;
  const std::string rg = EncodeRead(r);
  ASSERT_TRUE(DecodeRead(rg, 4, rout).ok());
  EXPECT_FALSE(DecodeRead(rg, 3, rout).ok());
  for (size_t n = 0; n < rg.size(); ++n) EXPECT_FALSE(DecodeRead(rg.substr(0, n), 4, rout).ok()) << n;
  FetchReply fr;
  fr.status = Corrupt("block 3 failed its checksum");
  fr.ssd = 2;
  FetchReply fback;
  ASSERT_TRUE(DecodeFetchReply(EncodeFetchReply(fr), fback).ok());
  EXPECT_EQ(fback.status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(fback.status.message(), fr.status.message());
  EXPECT_EQ(fback.ssd, 2u);
  std::string wild = EncodeFetchReply(fr);
  wild[0] = 99;  // no such status code
  EXPECT_FALSE(DecodeFetchReply(wild, fback).ok());
}

}  // namespace
}  // namespace trellis::grid
