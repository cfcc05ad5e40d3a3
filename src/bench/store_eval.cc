// trellis bench store: the PTStore evaluation in miniature.
//
// Nodes are real processes: each runs `trellis store` (its store server) and `trellis
// serve --store` (its engine), inside its own network namespace on an emulated cluster
// link (bench/cluster.h: veth pairs to a bridge, tc tbf 10gbit each way by default). The
// benchmark's client sends extractive-QA requests (a passage, then a question) to the
// nodes round-robin, one request in flight at a time, streamed, and times the first token
// (TTFT) and the whole answer (end to end). One request at a time because this machine's
// two cores cannot give four nodes a CPU each: with one request in flight, each TTFT is
// what that node, alone on the CPU, computes and fetches; the single-flight run below is
// the one place where requests overlap, because overlap is what it is about.
//
// Traces (synthetic token ids, seeded; the model's random weights make the text moot):
//   squad  - many questions per passage: 3 passages x 12 questions in random order (the
//            questions on the paragraphs being read now, from many users);
//   wikiqa - long passages, few questions: 8 passages x 2 questions in random order, so
//            reuse distances are long and caches must hold more.
// In `no-cache` every request computes its whole prompt, so only the first 8 requests of
// a trace run there (their mean is that configuration's; the rest would say nothing new).
// A request's prompt is the passage and a 24-token question; "context" is the whole
// prompt. Answers are 8 tokens.
//
// Configurations (same nodes, same trace):
//   no-cache              `serve --no-prefix-cache`: every prompt computed whole;
//   local                 each node's own radix cache only (vLLM/SGLang prefix caching);
//   store-no-replicas     the store with `--replica-share 0`: a node reads other nodes'
//                         prefixes from their owners over the link each time (EvoStore);
//   store                 the full store: replicas of hot remote tensors on the reader's
//                         node (`--store-no-single-flight`);
//   store+single-flight   the full store with single-flight (the defaults).
// Each node's KV pool holds two contexts of the run's length, so a node's own cache keeps
// its two latest passages and the working set beyond (three passages in squad, eight in
// wikiqa) lives in the store, as on a GPU whose KV memory serves many sessions.
// After each request the client waits until that node has finished publishing (its
// /metrics gauge trellis_store_publishes_in_flight is 0): with one request in flight, a
// publish would otherwise race the next request on another node, and on this machine
// share its CPU.
//
// Runs: (1) every configuration against context length (1k-8k) at the largest node count,
// for each trace; (2) against node count (1-4) at the longest context (first trace);
// (3) single-flight: every node receives the same new context at once (several times),
// with and without single-flight, against one node's cold TTFT; (4) local hits pay
// nothing: one node, phi 0.9 (a shared 90% prefix), with and without --store; (5) the
// miss-ratio curve: each trace's requests replayed against one real store server of
// several memory sizes (no engine: lookups, reads and puts of KV-sized blocks), hit ratio
// = tokens read / prompt tokens.
#include "bench/store_eval.h"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/cluster.h"
#include "bench/http.h"
#include "bench/report.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "store/client.h"
#include "store/server.h"

namespace trellis::bench {
namespace {

using json = nlohmann::json;

constexpr int kStorePort = 7100, kServePort = 8100, kBlockTokens = 32;

// ---- traces -----------------------------------------------------------------------------

struct TraceRequest {
  int passage = 0, question = 0;
  std::vector<int32_t> tokens;
};

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Ordinary word pieces of the LLaMA vocabularies: past the control and byte tokens.
std::vector<int32_t> Tokens(uint64_t seed, int n, int n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(std::max(n, 0)));
  const uint64_t lo = 1000, span = static_cast<uint64_t>(std::max(n_vocab, 2000)) - lo;
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(lo + Mix(seed * 1000003 + static_cast<uint64_t>(i)) % span);
  return t;
}

std::vector<TraceRequest> MakeTrace(const std::string& kind, int context, const StoreEvalOptions& o, int n_vocab,
                                    uint64_t salt = 0) {
  const bool squad = kind == "squad";
  const int passages = squad ? 3 : (o.quick ? 4 : 8);
  const int questions = squad ? (o.quick ? 4 : 12) : 2;
  const int passage_len = context - o.question_tokens;
  std::vector<TraceRequest> t;
  auto add = [&](int p, int q) {
    TraceRequest r{p, q, Tokens(Mix(salt * 7919 + (squad ? 1 : 2)) + static_cast<uint64_t>(p), passage_len, n_vocab)};
    const auto qt = Tokens(Mix(salt * 7919 + 99) + static_cast<uint64_t>(p * 1000 + q), o.question_tokens, n_vocab);
    r.tokens.insert(r.tokens.end(), qt.begin(), qt.end());
    t.push_back(std::move(r));
  };
  for (int p = 0; p < passages; ++p) {
    for (int q = 0; q < questions; ++q) add(p, q);
  }
  std::shuffle(t.begin(), t.end(), std::mt19937(7));
  return t;
}

// ---- configurations and nodes -----------------------------------------------------------

struct Config {
  const char* name;
  bool store, prefix_cache, replicas, single_flight;
};
constexpr Config kConfigs[] = {
    {"no-cache", false, false, false, false},
    {"local", false, true, false, false},
    {"store-no-replicas", true, true, false, false},
    {"store", true, true, true, false},
    {"store+single-flight", true, true, true, true},
};
constexpr int kNoCache = 0, kLocal = 1, kNoReplicas = 2, kStore = 3, kSingleFlight = 4;

struct NodeSetup {
  int ctx = 0;               // serve -c
  int64_t kv_blocks = 0;     // serve --kv-blocks
  uint64_t store_mem = 0;    // store --mem
};

class Nodes {
 public:
  static Result<std::unique_ptr<Nodes>> Start(const Cluster& cl, int n, const Config& c, const NodeSetup& s,
                                               const StoreEvalOptions& o, const std::string& tag) {
    auto nodes = std::unique_ptr<Nodes>(new Nodes());
    const std::string logs = o.out + "/logs/";
    std::vector<std::string> stores;
    for (int i = 0; i < n; ++i) stores.push_back(fmt::format("{}:{}", cl.host(i), kStorePort + cl.port_offset(i)));
    if (c.store) {
      for (int i = 0; i < n; ++i) {
        std::vector<std::string> a = {o.trellis, "store", "--listen", stores[static_cast<size_t>(i)], "--mem",
                                      std::to_string(s.store_mem), "--net-devices", cl.device()};
        std::string peers;
        for (int j = 0; j < n; ++j) {
          if (j != i) peers += (peers.empty() ? "" : ",") + stores[static_cast<size_t>(j)];
        }
        if (!peers.empty()) a.insert(a.end(), {"--peers", peers});
        if (!c.replicas) a.insert(a.end(), {"--replica-share", "0"});
        auto cmd = cl.On(i, a);
        nodes->procs_.push_back(std::make_unique<ChildProcess>());
        auto addr = nodes->procs_.back()->Start(cmd.exe, cmd.argv, logs + fmt::format("{}-store{}.log", tag, i),
                                                fmt::format("store {}", i), 60);
        if (!addr.ok()) return addr.status();
      }
    }
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> a = {o.trellis, "serve", "-m", o.model, "--host", cl.host(i), "--port",
                                    std::to_string(kServePort + cl.port_offset(i)), "-t", std::to_string(o.threads), "-c",
                                    std::to_string(s.ctx), "--kv-blocks", std::to_string(s.kv_blocks), "--max-running",
                                    "8", "--cache-type-k", o.kv_type, "--cache-type-v", o.kv_type};
      if (!c.prefix_cache) a.push_back("--no-prefix-cache");
      if (c.store) {
        std::string peers;
        for (int j = 0; j < n; ++j) {
          if (j != i) peers += (peers.empty() ? "" : ",") + stores[static_cast<size_t>(j)];
        }
        a.insert(a.end(), {"--store", stores[static_cast<size_t>(i)], "--store-net-devices", cl.device()});
        if (!peers.empty()) a.insert(a.end(), {"--store-peers", peers});
        if (!c.single_flight) a.push_back("--store-no-single-flight");
      }
      auto cmd = cl.On(i, a);
      nodes->procs_.push_back(std::make_unique<ChildProcess>());
      auto addr = nodes->procs_.back()->Start(cmd.exe, cmd.argv, logs + fmt::format("{}-serve{}.log", tag, i),
                                              fmt::format("serve {}", i), 120);
      if (!addr.ok()) return addr.status();
      nodes->urls_.push_back(*addr);
    }
    return nodes;
  }
  ~Nodes() {
    // Engines first (they publish to and read from the stores), then the stores.
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) (*it)->Stop();
  }
  const std::string& url(int i) const { return urls_[static_cast<size_t>(i)]; }

 private:
  std::vector<std::unique_ptr<ChildProcess>> procs_;
  std::vector<std::string> urls_;
};

// ---- one request ------------------------------------------------------------------------

struct Sample {
  std::string trace, config;
  int context = 0, nodes = 0, index = 0, node = 0, passage = 0, question = 0;
  double ttft_ms = -1, e2e_ms = -1;
  int prompt = 0, cached = 0, local = 0, store = 0, memory = 0, replica = 0, remote = 0, ssd = 0, waited = 0,
      computed = 0;
  std::string error;
};

int Int(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int>() : 0;
}

// Waits (up to 10 s) until the node at `url` has no publish in flight.
void WaitPublished(const std::string& url) {
  const Endpoint ep = ParseUrl(url);
  auto cli = MakeHttpClient(ep, 5);
  const std::string key = "trellis_store_publishes_in_flight ";
  for (int i = 0; i < 1000; ++i) {
    auto r = cli->Get(ep.prefix + "/metrics");
    if (!r || r->status != 200) return;
    const size_t at = r->body.find("\n" + key);
    if (at == std::string::npos || std::atof(r->body.c_str() + at + 1 + key.size()) == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Sample Send(const std::string& url, const std::vector<int32_t>& tokens, int answer_tokens) {
  Sample s;
  const Endpoint ep = ParseUrl(url);
  auto cli = MakeHttpClient(ep, 600);
  // logprobs: every token is its own chunk, even one whose text is an incomplete UTF-8
  // sequence (which would otherwise wait for the next), so the first chunk is the first token.
  const json body = {{"prompt", tokens},   {"max_tokens", answer_tokens},
                     {"temperature", 0},   {"stream", true},
                     {"logprobs", 1},      {"stream_options", {{"include_usage", true}}}};
  const SseOutcome out = PostSse(*cli, ep.prefix + "/v1/completions", body.dump(), [&](const json& ev, double t) {
    if (ev.contains("error")) {
      s.error = ev["error"].dump().substr(0, 200);
      return false;
    }
    if (s.ttft_ms < 0 && ev.contains("choices") && ev["choices"].is_array() && !ev["choices"].empty()) s.ttft_ms = t * 1e3;
    if (ev.contains("usage") && ev["usage"].is_object()) {
      const json& u = ev["usage"];
      s.prompt = Int(u, "prompt_tokens");
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
        s.cached = Int(u["prompt_tokens_details"], "cached_tokens");
      }
      if (u.contains("cache") && u["cache"].is_object()) {
        const json& c = u["cache"];
        s.local = Int(c, "local");
        s.store = Int(c, "store");
        s.waited = Int(c, "waited_for");
        s.computed = Int(c, "computed");
        if (c.contains("store_tiers") && c["store_tiers"].is_object()) {
          s.memory = Int(c["store_tiers"], "memory");
          s.replica = Int(c["store_tiers"], "replica");
          s.ssd = Int(c["store_tiers"], "ssd");
          s.remote = Int(c["store_tiers"], "remote");
        }
      } else {
        s.local = s.cached;
        s.computed = s.prompt - s.cached;
      }
    }
    return true;
  });
  if (s.error.empty() && !out.error.empty()) s.error = out.error;
  if (s.error.empty() && s.ttft_ms < 0) s.error = "no token came back";
  s.e2e_ms = out.seconds * 1e3;
  return s;
}

// ---- statistics ---------------------------------------------------------------------------

struct Summary {
  std::string trace, config;
  int context = 0, nodes = 0, requests = 0, errors = 0;
  double ttft_mean = 0, ttft_p50 = 0, e2e_mean = 0, reuse = 0;  // reuse: cached / prompt tokens
  double ttft_store_mean = 0;  // over the requests that read from the store
  int store_requests = 0;
  int64_t local = 0, store = 0, replica = 0, remote = 0, memory = 0, computed = 0, prompt = 0;
};

Summary Summarize(const std::vector<Sample>& v) {
  Summary s;
  std::vector<double> ttft, e2e, from_store;
  for (const Sample& x : v) {
    s.trace = x.trace, s.config = x.config, s.context = x.context, s.nodes = x.nodes;
    ++s.requests;
    if (!x.error.empty()) {
      ++s.errors;
      continue;
    }
    ttft.push_back(x.ttft_ms);
    e2e.push_back(x.e2e_ms);
    if (x.store > 0) from_store.push_back(x.ttft_ms);
    s.local += x.local, s.store += x.store, s.replica += x.replica, s.remote += x.remote, s.memory += x.memory;
    s.computed += x.computed, s.prompt += x.prompt;
  }
  s.ttft_mean = Mean(ttft), s.ttft_p50 = Median(ttft), s.e2e_mean = Mean(e2e);
  s.ttft_store_mean = Mean(from_store), s.store_requests = static_cast<int>(from_store.size());
  s.reuse = s.prompt ? static_cast<double>(s.local + s.store) / static_cast<double>(s.prompt) : 0;
  return s;
}

// ---- the evaluation -------------------------------------------------------------------------

class Eval {
 public:
  Eval(const StoreEvalOptions& o, int n_vocab, uint64_t kv_token_bytes)
      : o_(o), n_vocab_(n_vocab), kv_token_bytes_(kv_token_bytes) {}

  Status Init() {
    const int max_nodes = *std::max_element(o_.nodes.begin(), o_.nodes.end());
    if (!o_.loopback) {
      auto c = Cluster::Create(max_nodes, o_.rate);
      if (c.ok()) {
        cluster_ = std::move(*c);
      } else {
        std::fprintf(stderr, "bench store: %s; nodes go on loopback instead, links not shaped\n",
                     c.status().message().c_str());
      }
    }
    if (!cluster_) cluster_ = Cluster::Loopback(max_nodes);
    return {};
  }
  const Cluster& cluster() const { return *cluster_; }

  NodeSetup Setup(int context, int passages) const {
    NodeSetup s;
    const int ctx_tokens = context + o_.answer_tokens + kBlockTokens;
    s.ctx = (ctx_tokens + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
    s.kv_blocks = static_cast<int64_t>(o_.kv_contexts) * (s.ctx / kBlockTokens) + 8;
    // Every node could own the whole working set and still keep as much again for
    // replicas: memory is not what this run measures (the miss-ratio curve does).
    const uint64_t working = static_cast<uint64_t>(passages) * static_cast<uint64_t>(context) * kv_token_bytes_;
    s.store_mem = std::max<uint64_t>(2 * working + (16 << 20), 64 << 20);
    return s;
  }

  // Replays `trace` on n nodes under configuration c, one request at a time.
  Result<std::vector<Sample>> Replay(const std::string& trace_name, int context, int n, int c) {
    const auto trace = MakeTrace(trace_name, context, o_, n_vocab_);
    int passages = 0;
    for (const auto& r : trace) passages = std::max(passages, r.passage + 1);
    const std::string tag = fmt::format("{}-{}-n{}-{}", trace_name, context, n, kConfigs[c].name);
    TRELLIS_ASSIGN_OR_RETURN(auto nodes, Nodes::Start(*cluster_, n, kConfigs[c], Setup(context, passages), o_, tag));
    std::vector<Sample> out;
    const size_t n_requests = c == kNoCache ? std::min<size_t>(trace.size(), 8) : trace.size();
    for (size_t j = 0; j < n_requests; ++j) {
      const int node = static_cast<int>(j % static_cast<size_t>(n));
      Sample s = Send(nodes->url(node), trace[j].tokens, o_.answer_tokens);
      if (kConfigs[c].store) WaitPublished(nodes->url(node));
      s.trace = trace_name, s.config = kConfigs[c].name, s.context = context, s.nodes = n;
      s.index = static_cast<int>(j), s.node = node, s.passage = trace[j].passage, s.question = trace[j].question;
      if (!s.error.empty()) std::fprintf(stderr, "bench store: %s request %zu: %s\n", tag.c_str(), j, s.error.c_str());
      out.push_back(std::move(s));
    }
    const Summary sum = Summarize(out);
    std::fprintf(stderr, "bench store: %-40s TTFT mean %8.1f ms  reuse %5.1f%%  (local %lld, store %lld: replica %lld, remote %lld)%s\n",
                 tag.c_str(), sum.ttft_mean, 100 * sum.reuse, static_cast<long long>(sum.local),
                 static_cast<long long>(sum.store), static_cast<long long>(sum.replica),
                 static_cast<long long>(sum.remote), sum.errors ? fmt::format("  {} ERRORS", sum.errors).c_str() : "");
    return out;
  }

  // Every node gets the same new context at once, reps times; per rep the slowest TTFT and
  // the tokens computed.
  struct FlightRep {
    double slowest_ms = 0;
    int computed = 0, waited = 0, errors = 0;
  };
  Result<std::vector<FlightRep>> SingleFlight(int context, int n, int c) {
    const std::string tag = fmt::format("single-flight-{}-n{}-{}", context, n, kConfigs[c].name);
    TRELLIS_ASSIGN_OR_RETURN(auto nodes, Nodes::Start(*cluster_, n, kConfigs[c], Setup(context, o_.single_flight_reps), o_, tag));
    std::vector<FlightRep> reps;
    for (int rep = 0; rep < o_.single_flight_reps; ++rep) {
      const auto passage = Tokens(Mix(0x5f1 + static_cast<uint64_t>(rep)), context - o_.question_tokens, n_vocab_);
      std::vector<Sample> got(static_cast<size_t>(n));
      std::vector<std::thread> th;
      for (int i = 0; i < n; ++i) {
        th.emplace_back([&, i] {
          auto tokens = passage;
          const auto q = Tokens(Mix(0x9a + static_cast<uint64_t>(rep * 64 + i)), o_.question_tokens, n_vocab_);
          tokens.insert(tokens.end(), q.begin(), q.end());
          got[static_cast<size_t>(i)] = Send(nodes->url(i), tokens, o_.answer_tokens);
        });
      }
      for (auto& t : th) t.join();
      FlightRep r;
      std::string ttfts;
      for (const Sample& s : got) {
        ttfts += fmt::format("{}{:.0f}", ttfts.empty() ? "" : " ", s.ttft_ms);
        if (!s.error.empty()) {
          ++r.errors;
          std::fprintf(stderr, "bench store: %s: %s\n", tag.c_str(), s.error.c_str());
          continue;
        }
        r.slowest_ms = std::max(r.slowest_ms, s.ttft_ms);
        r.computed += s.computed;
        r.waited += s.waited;
      }
      std::fprintf(stderr, "bench store: %s rep %d: slowest TTFT %.1f ms, computed %d tokens, waited for %d (TTFTs %s)\n",
                   tag.c_str(), rep + 1, r.slowest_ms, r.computed, r.waited, ttfts.c_str());
      reps.push_back(r);
    }
    return reps;
  }

  // One node's cold TTFT for a new context (median of reps).
  Result<double> ColdTtft(int context) {
    const std::string tag = fmt::format("cold-{}", context);
    TRELLIS_ASSIGN_OR_RETURN(auto nodes, Nodes::Start(*cluster_, 1, kConfigs[kLocal], Setup(context, 1), o_, tag));
    std::vector<double> v;
    for (int rep = 0; rep < o_.single_flight_reps; ++rep) {
      auto tokens = Tokens(Mix(0xc01d + static_cast<uint64_t>(rep)), context, n_vocab_);
      const Sample s = Send(nodes->url(0), tokens, o_.answer_tokens);
      if (!s.error.empty()) return Internal("cold request: " + s.error);
      v.push_back(s.ttft_ms);
    }
    return Median(v);
  }

  // Mean TTFT of requests sharing a 90% prefix on one node, configuration c (after one
  // warm-up request that computes the prefix).
  Result<double> PhiRound(int context, int c, int round) {
    const std::string tag = fmt::format("phi-{}-{}", context, kConfigs[c].name);
    TRELLIS_ASSIGN_OR_RETURN(auto nodes, Nodes::Start(*cluster_, 1, kConfigs[c], Setup(context, 2), o_, tag));
    const int shared = context * 9 / 10;
    const auto prefix = Tokens(Mix(0xf1 + static_cast<uint64_t>(round)), shared, n_vocab_);
    std::vector<double> v;
    for (int i = 0; i <= 8; ++i) {
      auto tokens = prefix;
      const auto tail = Tokens(Mix(0xf2 + static_cast<uint64_t>(round * 100 + i)), context - shared, n_vocab_);
      tokens.insert(tokens.end(), tail.begin(), tail.end());
      const Sample s = Send(nodes->url(0), tokens, o_.answer_tokens);
      if (!s.error.empty()) return Internal("phi request: " + s.error);
      if (i > 0) v.push_back(s.ttft_ms);
    }
    return Mean(v);
  }

 private:
  const StoreEvalOptions& o_;
  int n_vocab_;
  uint64_t kv_token_bytes_;
  std::unique_ptr<Cluster> cluster_;
};

// The miss-ratio curve: hit ratio of `trace` against one store server of each size.
struct MrcPoint {
  std::string trace;
  uint64_t mem = 0, working = 0;
  double hit = 0;
};

Result<std::vector<MrcPoint>> MissRatioCurve(const std::string& trace_name, int context, const StoreEvalOptions& o,
                                             int n_vocab, uint64_t kv_token_bytes) {
  const auto trace = MakeTrace(trace_name, context, o, n_vocab);
  const uint64_t block_bytes = kv_token_bytes * kBlockTokens;
  int passages = 0;
  for (const auto& r : trace) passages = std::max(passages, r.passage + 1);
  const size_t n_blocks = static_cast<size_t>(context / kBlockTokens);
  const uint64_t working = static_cast<uint64_t>(passages) * n_blocks * block_bytes;
  std::vector<uint8_t> buf(n_blocks * block_bytes);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(Mix(i));
  std::vector<void*> dst;
  std::vector<const void*> src;
  for (size_t b = 0; b < n_blocks; ++b) {
    dst.push_back(buf.data() + b * block_bytes);
    src.push_back(buf.data() + b * block_bytes);
  }
  std::vector<MrcPoint> out;
  for (double f : {0.125, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5}) {
    store::ServerOptions so;
    so.mem_bytes = std::max<uint64_t>(static_cast<uint64_t>(f * static_cast<double>(working)), block_bytes);
    so.transport.net_devices = "lo";
    TRELLIS_ASSIGN_OR_RETURN(auto server, store::StoreServer::Start(so));
    store::ClientOptions co;
    co.servers = {fmt::format("127.0.0.1:{}", server->port())};
    co.transport.net_devices = "lo";
    auto deadline = [] { return net::After(std::chrono::milliseconds(30000)); };
    TRELLIS_ASSIGN_OR_RETURN(auto client, store::StoreClient::Connect(co, deadline()));
    store::Namespace ns;
    ns.model_fingerprint = 0x3a7c;
    int64_t hit = 0, total = 0;
    for (const auto& r : trace) {
      total += static_cast<int64_t>(r.tokens.size());
      auto found = client->Lookup(ns, r.tokens, deadline());
      if (found.ok() && found->blocks > 0) {
        const size_t nb = std::min(found->blocks, n_blocks);
        if (client->Get(*found, nb, std::span<void* const>(dst.data(), nb), block_bytes, deadline()).ok()) {
          hit += static_cast<int64_t>(nb) * kBlockTokens;
        }
      }
      const std::span<const int32_t> whole(r.tokens.data(), n_blocks * kBlockTokens);
      (void)client->Put(ns, whole, src, block_bytes, 1e-3 * static_cast<double>(whole.size()), deadline());
    }
    out.push_back({trace_name, so.mem_bytes, working, total ? static_cast<double>(hit) / static_cast<double>(total) : 0});
    std::fprintf(stderr, "bench store: miss-ratio curve %s: store of %.0f MiB (%.2f of the working set): hit ratio %.3f\n",
                 trace_name.c_str(), static_cast<double>(so.mem_bytes) / (1 << 20), f, out.back().hit);
  }
  return out;
}

std::string CsvRow(const Sample& s) {
  return fmt::format("{},{},{},{},{},{},{},{},{:.2f},{:.2f},{},{},{},{},{},{},{},{},{},{}\n", s.trace, s.config, s.context,
                     s.nodes, s.index, s.node, s.passage, s.question, s.ttft_ms, s.e2e_ms, s.prompt, s.cached, s.local,
                     s.store, s.memory, s.replica, s.remote, s.waited, s.computed, s.error.empty() ? "" : "error");
}

}  // namespace

int RunStoreEval(const StoreEvalOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "bench store: %s\n", m.c_str());
    return 1;
  };
  if (o.contexts.empty() || o.nodes.empty() || o.traces.empty()) return fail("contexts, nodes and traces must be given");
  for (int c : o.contexts) {
    if (c < 2 * kBlockTokens + o.question_tokens) return fail("contexts must hold at least two blocks and a question");
  }
  for (int n : o.nodes) {
    if (n < 1 || n > 16) return fail("node counts are 1 to 16");
  }
  for (const auto& t : o.traces) {
    if (t != "squad" && t != "wikiqa") return fail("traces are squad and wikiqa");
  }
  auto gguf = GgufFile::Open(o.model);
  if (!gguf.ok()) return fail(gguf.status().ToString());
  auto cfg = ModelConfig::FromGguf(*gguf);
  if (!cfg.ok()) return fail(cfg.status().ToString());
  const int max_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  if (max_ctx + o.answer_tokens + kBlockTokens > cfg->n_ctx_train) {
    return fail(fmt::format("the model's context is {} tokens; the longest run needs {}", cfg->n_ctx_train,
                            max_ctx + o.answer_tokens + kBlockTokens));
  }
  // f16 K and V of every layer (docs/kv_layout.md).
  const uint64_t kv_token_bytes = 2ull * 2 * static_cast<uint64_t>(cfg->n_layer) * static_cast<uint64_t>(cfg->kv_dim());
  {
    std::error_code ec;
    std::filesystem::create_directories(o.out + "/logs", ec);
    if (ec) return fail(fmt::format("cannot create {}/logs: {}", o.out, ec.message()));
  }

  Eval ev(o, cfg->n_vocab, kv_token_bytes);
  if (Status s = ev.Init(); !s.ok()) return fail(s.ToString());
  const int max_nodes = *std::max_element(o.nodes.begin(), o.nodes.end());
  std::vector<int> contexts = o.contexts, node_counts = o.nodes;
  std::sort(contexts.begin(), contexts.end());
  std::sort(node_counts.begin(), node_counts.end());

  std::ofstream csv(o.out + "/store_eval.csv");
  const std::string header = RunHeader() +
                             fmt::format("# model: {} ({} layers, {} wide, {} KV heads; {} KV bytes per token)\n# cluster: {}\n",
                                         o.model, cfg->n_layer, cfg->n_embd, cfg->n_head_kv, kv_token_bytes,
                                         ev.cluster().Describe());
  csv << header
      << "trace,config,context,nodes,index,node,passage,question,ttft_ms,e2e_ms,prompt,cached,local,store,store_memory,"
         "store_replica,store_remote,waited_for,computed,error\n";
  std::vector<Summary> sums;
  auto run = [&](const std::string& trace, int context, int n, int c) -> bool {
    auto r = ev.Replay(trace, context, n, c);
    if (!r.ok()) {
      fail(r.status().ToString());
      return false;
    }
    for (const Sample& s : *r) csv << CsvRow(s);
    csv.flush();
    sums.push_back(Summarize(*r));
    return true;
  };
  // (1) context sweep at the largest node count; (2) node sweep at the longest context.
  for (const auto& trace : o.traces) {
    for (int context : contexts) {
      for (int c = 0; c < 5; ++c) {
        if (!run(trace, context, max_nodes, c)) return 1;
      }
    }
  }
  for (int n : node_counts) {
    if (n == max_nodes) continue;
    for (int c = 0; c < 5; ++c) {
      if (!run(o.traces.front(), max_ctx, n, c)) return 1;
    }
  }
  auto find = [&](const std::string& trace, int context, int n, int c) -> const Summary* {
    for (const Summary& s : sums) {
      if (s.trace == trace && s.context == context && s.nodes == n && s.config == kConfigs[c].name) return &s;
    }
    return nullptr;
  };

  // (3) single-flight.
  auto cold = ev.ColdTtft(max_ctx);
  if (!cold.ok()) return fail(cold.status().ToString());
  auto flight_off = ev.SingleFlight(max_ctx, max_nodes, kStore);
  if (!flight_off.ok()) return fail(flight_off.status().ToString());
  auto flight_on = ev.SingleFlight(max_ctx, max_nodes, kSingleFlight);
  if (!flight_on.ok()) return fail(flight_on.status().ToString());

  // (4) local hits pay nothing: alternating rounds, one node, phi 0.9.
  const int phi_ctx = std::min(max_ctx, 2048);
  std::vector<double> phi_local, phi_store, phi_ratio;
  for (int round = 0; round < o.phi_rounds; ++round) {
    auto a = ev.PhiRound(phi_ctx, kLocal, round);
    if (!a.ok()) return fail(a.status().ToString());
    auto b = ev.PhiRound(phi_ctx, kSingleFlight, round);
    if (!b.ok()) return fail(b.status().ToString());
    phi_local.push_back(*a), phi_store.push_back(*b), phi_ratio.push_back(*b / *a);
    std::fprintf(stderr, "bench store: phi 0.9 round %d: TTFT %.1f ms without the store, %.1f with (%.3f)\n", round + 1,
                 *a, *b, *b / *a);
  }

  // (5) miss-ratio curves.
  std::vector<MrcPoint> mrc;
  for (const auto& trace : o.traces) {
    auto m = MissRatioCurve(trace, max_ctx, o, cfg->n_vocab, kv_token_bytes);
    if (!m.ok()) return fail(m.status().ToString());
    mrc.insert(mrc.end(), m->begin(), m->end());
  }

  // ---- output --------------------------------------------------------------------------
  {
    std::ofstream f(o.out + "/store_eval_summary.csv");
    f << header
      << "trace,config,context,nodes,requests,errors,ttft_mean_ms,ttft_p50_ms,e2e_mean_ms,reuse,local,store,"
         "store_memory,store_replica,store_remote,computed,prompt,store_requests,ttft_store_mean_ms\n";
    for (const Summary& s : sums) {
      f << fmt::format("{},{},{},{},{},{},{:.2f},{:.2f},{:.2f},{:.4f},{},{},{},{},{},{},{},{},{:.2f}\n", s.trace, s.config,
                       s.context, s.nodes, s.requests, s.errors, s.ttft_mean, s.ttft_p50, s.e2e_mean, s.reuse, s.local,
                       s.store, s.memory, s.replica, s.remote, s.computed, s.prompt, s.store_requests, s.ttft_store_mean);
    }
    f << fmt::format("# single-flight,{} nodes,{} tokens: cold {:.2f} ms\n", max_nodes, max_ctx, *cold);
    for (size_t i = 0; i < flight_on->size(); ++i) {
      f << fmt::format("# single-flight rep {}: slowest TTFT {:.2f} ms with (computed {}), {:.2f} ms without (computed {})\n",
                       i + 1, (*flight_on)[i].slowest_ms, (*flight_on)[i].computed, (*flight_off)[i].slowest_ms,
                       (*flight_off)[i].computed);
    }
    for (size_t i = 0; i < phi_ratio.size(); ++i) {
      f << fmt::format("# phi 0.9 round {}: {:.2f} ms without the store, {:.2f} ms with\n", i + 1, phi_local[i], phi_store[i]);
    }
  }
  {
    std::ofstream f(o.out + "/store_eval_mrc.csv");
    f << header << "trace,store_bytes,working_set_bytes,hit_ratio\n";
    for (const MrcPoint& p : mrc) f << fmt::format("{},{},{},{:.4f}\n", p.trace, p.mem, p.working, p.hit);
  }

  std::printf("%s\n", header.c_str());
  std::printf("One request in flight at a time, round-robin over the nodes; TTFT and end-to-end in ms, means over each "
              "trace's requests; reuse = prompt tokens not computed.\n");
  for (const auto& trace : o.traces) {
    std::printf("\n### %s: mean TTFT (ms) against context length, %d nodes\n\n| context |", trace.c_str(), max_nodes);
    for (const Config& c : kConfigs) std::printf(" %s |", c.name);
    std::printf(" local / store | no-replicas / store | no-cache / store |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int context : contexts) {
      std::printf("| %d |", context);
      for (int c = 0; c < 5; ++c) {
        const Summary* s = find(trace, context, max_nodes, c);
        std::printf(" %.0f (%.0f%%) |", s ? s->ttft_mean : 0, s ? 100 * s->reuse : 0);
      }
      const Summary* st = find(trace, context, max_nodes, kStore);
      auto ratio = [&](int c) {
        const Summary* s = find(trace, context, max_nodes, c);
        return s && st && st->ttft_mean > 0 ? s->ttft_mean / st->ttft_mean : 0;
      };
      std::printf(" %.2f | %.2f | %.2f |\n", ratio(kLocal), ratio(kNoReplicas), ratio(kNoCache));
    }
    std::printf("\nrequests that read from the store: mean TTFT (ms), and where their store tokens were "
                "(this node's memory / a replica here / another node):\n\n| context |");
    for (int c = kNoReplicas; c < 5; ++c) std::printf(" %s |", kConfigs[c].name);
    std::printf("\n|---|---|---|---|\n");
    for (int context : contexts) {
      std::printf("| %d |", context);
      for (int c = kNoReplicas; c < 5; ++c) {
        const Summary* s = find(trace, context, max_nodes, c);
        if (!s) {
          std::printf(" |");
          continue;
        }
        std::printf(" %.0f over %d (%lld / %lld / %lld) |", s->ttft_store_mean, s->store_requests,
                    static_cast<long long>(s->memory), static_cast<long long>(s->replica),
                    static_cast<long long>(s->remote));
      }
      std::printf("\n");
    }
    std::printf("\nmean end-to-end (ms):\n\n| context |");
    for (const Config& c : kConfigs) std::printf(" %s |", c.name);
    std::printf("\n|---|---|---|---|---|---|\n");
    for (int context : contexts) {
      std::printf("| %d |", context);
      for (int c = 0; c < 5; ++c) {
        const Summary* s = find(trace, context, max_nodes, c);
        std::printf(" %.0f |", s ? s->e2e_mean : 0);
      }
      std::printf("\n");
    }
  }
  std::printf("\n### %s: mean TTFT (ms) against node count, %d-token contexts\n\n| nodes |", o.traces.front().c_str(),
              max_ctx);
  for (const Config& c : kConfigs) std::printf(" %s |", c.name);
  std::printf("\n|---|---|---|---|---|---|\n");
  for (int n : node_counts) {
    std::printf("| %d |", n);
    for (int c = 0; c < 5; ++c) {
      const Summary* s = find(o.traces.front(), max_ctx, n, c);
      std::printf(" %.0f (%.0f%%) |", s ? s->ttft_mean : 0, s ? 100 * s->reuse : 0);
    }
    std::printf("\n");
  }
  std::vector<double> on_slow, off_slow;
  int on_computed = 0, off_computed = 0;
  for (const auto& r : *flight_on) on_slow.push_back(r.slowest_ms), on_computed += r.computed;
  for (const auto& r : *flight_off) off_slow.push_back(r.slowest_ms), off_computed += r.computed;
  const double passage = static_cast<double>(max_ctx - o.question_tokens) * static_cast<double>(o.single_flight_reps);
  std::printf("\n### single-flight: %d nodes receive the same new %d-token context at once (%d times)\n\n", max_nodes,
              max_ctx, o.single_flight_reps);
  std::printf("| | slowest TTFT, median (ms) | / one node's cold TTFT (%.0f ms) | contexts computed per new context |\n"
              "|---|---|---|---|\n",
              *cold);
  std::printf("| store+single-flight | %.0f | %.2f | %.2f |\n", Median(on_slow), Median(on_slow) / *cold,
              on_computed / passage);
  std::printf("| store (no single-flight) | %.0f | %.2f | %.2f |\n", Median(off_slow), Median(off_slow) / *cold,
              off_computed / passage);
  std::printf("\n### local hits pay nothing: one node, phi 0.9, %d-token contexts, %d alternating rounds\n\n", phi_ctx,
              o.phi_rounds);
  std::printf("| mean TTFT without --store (ms) | with --store (ms) | with / without, median of the rounds |\n|---|---|---|\n");
  std::printf("| %.1f | %.1f | %.3f |\n", Median(phi_local), Median(phi_store), Median(phi_ratio));
  std::printf("\n### miss-ratio curve: hit ratio against one store server's memory, %d-token contexts\n\n", max_ctx);
  std::printf("| trace | store memory (MiB) | share of the working set | hit ratio |\n|---|---|---|---|\n");
  for (const MrcPoint& p : mrc) {
    std::printf("| %s | %.1f | %.2f | %.3f |\n", p.trace.c_str(), static_cast<double>(p.mem) / (1 << 20),
                static_cast<double>(p.mem) / static_cast<double>(p.working), p.hit);
  }
  const Summary* lo = find(o.traces.front(), max_ctx, max_nodes, kLocal);
  const Summary* nr = find(o.traces.front(), max_ctx, max_nodes, kNoReplicas);
  const Summary* nc = find(o.traces.front(), max_ctx, max_nodes, kNoCache);
  const Summary* st = find(o.traces.front(), max_ctx, max_nodes, kStore);
  if (lo && nr && nc && st && st->ttft_mean > 0) {
    std::printf("\n### targets (%s, %d tokens, %d nodes; this run)\n\n| target | measured | met |\n|---|---|---|\n",
                o.traces.front().c_str(), max_ctx, max_nodes);
    auto row = [](const char* what, double v, bool met) { std::printf("| %s | %.2f | %s |\n", what, v, met ? "yes" : "NO"); };
    row("store TTFT >= 2x faster than local", lo->ttft_mean / st->ttft_mean, lo->ttft_mean / st->ttft_mean >= 2);
    row("store >= 1.2x faster than store-no-replicas", nr->ttft_mean / st->ttft_mean, nr->ttft_mean / st->ttft_mean >= 1.2);
    row("store >= 5x faster than no-cache", nc->ttft_mean / st->ttft_mean, nc->ttft_mean / st->ttft_mean >= 5);
    row("single-flight: slowest TTFT / cold <= 1.2", Median(on_slow) / *cold, Median(on_slow) / *cold <= 1.2);
    row("single-flight: contexts computed per new context = 1", on_computed / passage,
        std::abs(on_computed / passage - 1) < 0.05);
    row("phi 0.9: TTFT with --store / without <= 1.05", Median(phi_ratio), Median(phi_ratio) <= 1.05);
  }

  if (o.plots && std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    for (const auto& trace : o.traces) {
      std::ofstream d(o.out + "/ttft_vs_context_" + trace + ".dat");
      for (int c = 0; c < 5; ++c) {
        for (int context : contexts) {
          const Summary* s = find(trace, context, max_nodes, c);
          if (s) d << context << " " << s->ttft_mean << "\n";
        }
        d << "\n\n";
      }
      d.close();
      std::vector<std::string> names;
      for (const Config& c : kConfigs) names.push_back(c.name);
      Plot("bench store", o.out, "ttft_vs_context_" + trace, fmt::format("{}: mean TTFT, {} nodes", trace, max_nodes),
           "context (tokens)", "TTFT (ms)", o.out + "/ttft_vs_context_" + trace + ".dat", names, true);
    }
    {
      std::ofstream d(o.out + "/ttft_vs_nodes.dat");
      for (int c = 0; c < 5; ++c) {
        for (int n : node_counts) {
          const Summary* s = find(o.traces.front(), max_ctx, n, c);
          if (s) d << n << " " << s->ttft_mean << "\n";
        }
        d << "\n\n";
      }
      d.close();
      std::vector<std::string> names;
      for (const Config& c : kConfigs) names.push_back(c.name);
      Plot("bench store", o.out, "ttft_vs_nodes", fmt::format("{}: mean TTFT, {}-token contexts", o.traces.front(), max_ctx), "nodes",
           "TTFT (ms)", o.out + "/ttft_vs_nodes.dat", names, true);
    }
    {
      std::ofstream d(o.out + "/mrc.dat");
      for (const auto& trace : o.traces) {
        for (const MrcPoint& p : mrc) {
          if (p.trace == trace) d << static_cast<double>(p.mem) / static_cast<double>(p.working) << " " << p.hit << "\n";
        }
        d << "\n\n";
      }
      d.close();
      Plot("bench store", o.out, "mrc", fmt::format("hit ratio against store memory, {}-token contexts", max_ctx),
           "store memory / working set", "hit ratio", o.out + "/mrc.dat", o.traces, false);
    }
    std::printf("\nplots: %s/{ttft_vs_context_*,ttft_vs_nodes,mrc}.png\n", o.out.c_str());
  }
  std::printf("CSV: %s/store_eval.csv (per request), store_eval_summary.csv, store_eval_mrc.csv; logs in %s/logs\n",
              o.out.c_str(), o.out.c_str());
  int errors = 0;
  for (const Summary& s : sums) errors += s.errors;
  if (errors) return fail(fmt::format("{} requests failed (see the CSV and logs)", errors));
  return 0;
}

}  // namespace trellis::bench
