// trellis bench grid: a model's layers on 1, 2 and 3 processes against one process.
//
// Configurations, each its own processes, started afresh for every repetition and
// alternated so that the machine's drift falls on all of them alike:
//   baseline   one `trellis serve` with the whole model and --baseline-threads (2);
//   1 node     one `trellis serve`, whole model, --node-threads (1);
//   N nodes    a `trellis serve --grid` head holding the embeddings, the output head and
//              the first layers, and N-1 `trellis node` processes holding the rest, each
//              with --node-threads. Layers are split so that every process streams about
//              as many weight bytes per step (the head's output matrix counts).
// Each runs on plain loopback and, as root, on network namespaces (bench/cluster.h:
// veth pairs, a bridge, tc tbf --rate each way): the head on node 0, grid node i on
// node i. All processes share this machine's cores.
//
// Measured against each, from a client in the host namespace, streamed, token ids as
// prompts (random weights make the text moot; EOS is banned so every answer is full):
//   decode 1      one session: tokens/s over its --decode-tokens;
//   decode S      S sessions at once: tokens/s of all of them in the window where all
//                 are decoding;
//   TTFT L        a new L-token prompt, cold (median of three);
//   TTFT phi      a prompt sharing its first phi x L tokens with one sent just before
//                 (median of three):
//                 the check is TTFT(phi) <= (1 - hit) x TTFT(cold) + 5%;
//   memory        every process's VmRSS after the runs, against its share of the weights
//                 plus its KV pool;
//   bytes/token   what the head sent to and received from the nodes per token row.
//
// The pipeline model predicts the same figures from this machine's parts, measured in
// this process before anything else runs: one layer's time at r decode rows and per
// prefill chunk, the output head's, each link's round trip and bandwidth (the head
// measures them at connect: /metrics). For S sessions in G micro-batches of r = S/G:
//   stage_i(r) = layers_i x layer(r)   (+ output(r) at the head)
//   loop(r)    = sum_i stage_i(r) + sum over nodes (rtt + 2 r E 4 / bandwidth)
//   period     = max(loop(r), G x max_i stage_i(r), G x sum_i stage_i(r) / cores)
//   decode S   = S / period;  decode 1 = 1 / loop(1)
//   TTFT L     = the prompt's chunks through the stages in order (a flow shop), each
//                stage's chunk time layers_i x (a + b c), never faster than the cores
//                allow; stage times are those measured with the other core busy when
//                the stages share this machine
// and gives the same for --predict-nodes processes on a --predict-gbit link, each with
// a core of its own.
#include "bench/grid_eval.h"
#include "bench/grid_predict.h"

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench/cluster.h"
#include "bench/http.h"
#include "bench/report.h"
#include "engine/kv_layout.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "kv/block_pool.h"
#include "model/gguf.h"
#include "util/clock.h"
#include "util/thread_pool.h"

namespace trellis::bench {
namespace {

using json = nlohmann::json;
using namespace grid_model;

constexpr int kNodePort = 7300, kGridServePort = 8300, kGridStorePort = 7500;

// ---- processes ----------------------------------------------------------------------------------

struct GridConfig {
  std::string name;
  int nodes = 1;    // processes
  int threads = 1;  // each
  std::vector<int> layers;  // per process, [0] the head's
};

double RssMiB(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return -1;
}

class Procs {
 public:
  // store: a `trellis store` server on node 0 as well, and every process started with
  // --store (a grid's nodes read their layers from it).
  static Result<std::unique_ptr<Procs>> Start(const Cluster& cl, const GridConfig& c, const GridEvalOptions& o,
                                               int kv_blocks, const std::string& tag, bool store = false) {
    auto p = std::unique_ptr<Procs>(new Procs());
    const std::string logs = o.out + "/logs/";
    std::vector<std::string> store_flags;
    if (store) {
      const std::string addr = fmt::format("{}:{}", cl.host(0), kGridStorePort + cl.port_offset(0));
      auto cmd = cl.On(0, {o.trellis, "store", "--listen", addr, "--mem", "2G", "--net-devices", cl.device()});
      p->store_ = std::make_unique<ChildProcess>();
      auto a = p->store_->Start(cmd.exe, cmd.argv, logs + tag + "-store.log", "store", 60);
      if (!a.ok()) return a.status();
      store_flags = {"--store", addr, "--store-net-devices", cl.device()};
    }
    std::string spec;
    int first = c.layers[0];
    for (int i = 1; i < c.nodes; ++i) {
      const int last = first + c.layers[static_cast<size_t>(i)] - 1;
      const std::string addr = fmt::format("{}:{}", cl.host(i), kNodePort + cl.port_offset(i));
      spec += fmt::format("{}{}={}-{}", spec.empty() ? "" : ",", addr, first, last);
      std::vector<std::string> na = {o.trellis, "node", "-m", o.model, "--layers", fmt::format("{}-{}", first, last), "-t",
                                     std::to_string(c.threads), "--listen", addr, "--net-devices", cl.device()};
      na.insert(na.end(), store_flags.begin(), store_flags.end());
      auto cmd = cl.On(i, na);
      p->procs_.push_back(std::make_unique<ChildProcess>());
      const std::string log = logs + fmt::format("{}-node{}.log", tag, i);
      p->node_logs_.push_back(log);
      auto a = p->procs_.back()->Start(cmd.exe, cmd.argv, log, fmt::format("node {}", i), 120);
      if (!a.ok()) return a.status();
      first = last + 1;
    }
    std::vector<std::string> a = {o.trellis, "serve", "-m", o.model, "--host", cl.host(0), "--port",
                                  std::to_string(kGridServePort + cl.port_offset(0)), "-t", std::to_string(c.threads),
                                  "--kv-blocks", std::to_string(kv_blocks), "--max-running", "16", "-c",
                                  std::to_string(std::min(o.prompt + o.decode_tokens + 4 * kBlock, 4096))};
    if (c.nodes > 1) {
      a.insert(a.end(), {"--grid", spec, "--grid-net-devices", cl.device(), "--grid-depth", std::to_string(o.depth),
                         "--grid-chunk", std::to_string(o.chunk)});
    }
    a.insert(a.end(), store_flags.begin(), store_flags.end());
    p->head_cmd_ = cl.On(0, a);
    p->head_log_ = logs + tag + "-head.log";
    p->procs_.push_back(std::make_unique<ChildProcess>());
    TRELLIS_RETURN_IF_ERROR(p->StartHead());
    return p;
  }
  ~Procs() { Stop(); }
  void Stop() {
    // The head first (it holds the nodes' connections), then the nodes, then the store.
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) (*it)->Stop();
    if (store_) store_->Stop();
  }
  // A new head process, the nodes (and store) kept: its cache, and the nodes' pools, start
  // empty.
  Status RestartHead() {
    procs_.back()->Stop();
    head_log_ += ".restarted";
    return StartHead();
  }
  const std::string& url() const { return url_; }
  // VmRSS of every process in MiB: [0] the head's, then the nodes'.
  std::vector<double> Rss() const {
    std::vector<double> r = {RssMiB(procs_.back()->pid())};
    for (size_t i = 0; i + 1 < procs_.size(); ++i) r.push_back(RssMiB(procs_[i]->pid()));
    return r;
  }
  // The nodes' compute seconds, from the line each prints when it stops. Call after Stop.
  std::vector<double> NodeComputeSeconds() const {
    std::vector<double> out;
    for (const auto& log : node_logs_) {
      std::ifstream f(log);
      std::string line, last;
      while (std::getline(f, line)) {
        if (line.find(" s computing") != std::string::npos) last = line;
      }
      const size_t at = last.find(" s computing");
      size_t b = at;
      while (b > 0 && last[b - 1] != ' ') --b;
      out.push_back(at == std::string::npos ? -1 : std::atof(last.substr(b, at - b).c_str()));
    }
    return out;
  }

 private:
  Procs() = default;
  Status StartHead() {
    auto url = procs_.back()->Start(head_cmd_.exe, head_cmd_.argv, head_log_, "head", 180);
    if (!url.ok()) return url.status();
    url_ = *url;
    return Status::Ok();
  }
  std::vector<std::unique_ptr<ChildProcess>> procs_;  // nodes, then the head
  std::unique_ptr<ChildProcess> store_;
  std::vector<std::string> node_logs_;
  std::string url_;
  Cluster::Command head_cmd_;
  std::string head_log_;
};

// ---- requests ----------------------------------------------------------------------------------

struct Stream {
  std::vector<double> t;  // seconds since sending, per token
  int prompt = 0, cached = 0;
  std::string error;
};

Stream Send(const std::string& url, const std::vector<int32_t>& prompt, int max_tokens, int eos) {
  Stream s;
  const Endpoint ep = ParseUrl(url);
  auto cli = MakeHttpClient(ep, 600);
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true},
               {"logprobs", 1},    {"stream_options", {{"include_usage", true}}}};
  if (eos >= 0) body["logit_bias"] = {{std::to_string(eos), -100}};
  const SseOutcome out = PostSse(*cli, ep.prefix + "/v1/completions", body.dump(), [&](const json& ev, double t) {
    if (ev.contains("error")) {
      s.error = ev["error"].dump().substr(0, 300);
      return false;
    }
    if (ev.contains("choices") && ev["choices"].is_array() && !ev["choices"].empty()) s.t.push_back(t);
    if (ev.contains("usage") && ev["usage"].is_object()) {
      const json& u = ev["usage"];
      s.prompt = u.value("prompt_tokens", 0);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
        s.cached = u["prompt_tokens_details"].value("cached_tokens", 0);
      }
    }
    return true;
  });
  if (s.error.empty() && !out.error.empty()) s.error = out.error;
  if (s.error.empty() && s.t.empty()) s.error = "no token came back";
  return s;
}

// Metrics from the head's /metrics (0 when absent).
std::map<std::string, double> Metrics(const std::string& url) {
  std::map<std::string, double> m;
  const Endpoint ep = ParseUrl(url);
  auto cli = MakeHttpClient(ep, 10);
  auto r = cli->Get(ep.prefix + "/metrics");
  if (!r || r->status != 200) return m;
  std::istringstream in(r->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    m[line.substr(0, sp)] = std::atof(line.c_str() + sp + 1);
  }
  return m;
}

// The store runs: TTFT of L-token prompts computed (the store on: a lookup misses first,
// the blocks are published after), then, on a new head process whose cache and nodes'
// pools start empty, of the same prompts read from the store (each process reading its
// layers). Medians of three prompts.
struct StoreSample {
  std::string link, config;
  int nodes = 0, rep = 0;
  double ttft_cold_ms = 0, ttft_store_ms = 0, hit = 0;
  std::string error;
};

struct GridSample {
  std::string link, config;
  int nodes = 0, rep = 0;
  double decode1 = 0, decode_s = 0, ttft_cold_ms = 0, ttft_phi_ms = 0, hit = 0;
  double bytes_per_token = 0, rtt_us = 0, bandwidth = 0;
  double head_layers_s = 0, head_wait_s = 0, head_logits_s = 0;
  std::vector<double> rss, expected, node_compute;
  std::string error;
};

class GridEval {
 public:
  GridEval(const GridEvalOptions& o, const Geometry& g) : o_(o), g_(g), rng_(12345) {}

  std::vector<int32_t> Tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng_() % static_cast<uint32_t>(g_.n_vocab - 300)) + 300;
    return t;
  }

  int KvBlocks() const {
    const int per = (o_.prompt + o_.decode_tokens + 2 * kBlock) / kBlock + 1;
    return per * (o_.sessions + 4);
  }

  double Expected(const GridConfig& c, size_t i) const {
    const double kv = static_cast<double>(KvBlocks()) * g_.kv_layer_block_bytes * c.layers[i];
    double w = c.layers[i] * g_.layer_bytes;
    if (i == 0) w += g_.output_bytes + g_.embd_bytes;
    return (w + kv) / (1 << 20);
  }

  Result<GridSample> Run(const Cluster& cl, const std::string& link, const GridConfig& c, int rep) {
    GridSample s;
    s.link = link, s.config = c.name, s.nodes = c.nodes, s.rep = rep;
    const std::string tag = fmt::format("{}-{}-r{}", link, c.name, rep);
    TRELLIS_ASSIGN_OR_RETURN(auto procs, Procs::Start(cl, c, o_, KvBlocks(), tag));
    const std::string& url = procs->url();
    const auto m0 = Metrics(url);
    // Warm-up: one short request (first touches, connections).
    (void)Send(url, Tokens(16), 4, g_.eos);

    // decode 1
    {
      Stream st = Send(url, Tokens(16), o_.decode_tokens, g_.eos);
      if (!st.error.empty()) return Internal(fmt::format("{}: decode 1: {}", tag, st.error));
      if (st.t.size() >= 2) s.decode1 = static_cast<double>(st.t.size() - 1) / (st.t.back() - st.t.front());
    }
    // decode S: all at once; the window where every session decodes.
    {
      std::vector<Stream> out(static_cast<size_t>(o_.sessions));
      std::vector<std::vector<int32_t>> prompts;
      for (int i = 0; i < o_.sessions; ++i) prompts.push_back(Tokens(16));
      const double t0 = NowSeconds();
      std::vector<double> start(static_cast<size_t>(o_.sessions));
      std::vector<std::thread> th;
      for (int i = 0; i < o_.sessions; ++i) {
        th.emplace_back([&, i] {
          start[static_cast<size_t>(i)] = NowSeconds() - t0;
          out[static_cast<size_t>(i)] = Send(url, prompts[static_cast<size_t>(i)], o_.decode_tokens, g_.eos);
        });
      }
      for (auto& t : th) t.join();
      double begin = 0, end = 1e300;
      for (int i = 0; i < o_.sessions; ++i) {
        const Stream& st = out[static_cast<size_t>(i)];
        if (!st.error.empty()) return Internal(fmt::format("{}: decode {}: {}", tag, o_.sessions, st.error));
        begin = std::max(begin, start[static_cast<size_t>(i)] + st.t.front());
        end = std::min(end, start[static_cast<size_t>(i)] + st.t.back());
      }
      int64_t n = 0;
      for (int i = 0; i < o_.sessions; ++i) {
        for (double t : out[static_cast<size_t>(i)].t) {
          const double at = start[static_cast<size_t>(i)] + t;
          n += (at > begin && at <= end) ? 1 : 0;
        }
      }
      s.decode_s = end > begin ? static_cast<double>(n) / (end - begin) : 0;
    }
    // TTFT cold, then TTFT(phi) after its prefix was sent: medians of three each.
    {
      std::vector<double> cold_ms, phi_ms, hits;
      for (int k = 0; k < 3; ++k) {
        Stream cold = Send(url, Tokens(o_.prompt), 1, g_.eos);
        if (!cold.error.empty()) return Internal(fmt::format("{}: TTFT: {}", tag, cold.error));
        cold_ms.push_back(cold.t.front() * 1e3);
        const int shared = static_cast<int>(o_.phi * o_.prompt);
        std::vector<int32_t> prefix = Tokens(shared);
        Stream warm = Send(url, prefix, 1, g_.eos);
        if (!warm.error.empty()) return Internal(fmt::format("{}: TTFT(phi) warm-up: {}", tag, warm.error));
        std::vector<int32_t> p = prefix;
        const auto rest = Tokens(o_.prompt - shared);
        p.insert(p.end(), rest.begin(), rest.end());
        Stream hot = Send(url, p, 1, g_.eos);
        if (!hot.error.empty()) return Internal(fmt::format("{}: TTFT(phi): {}", tag, hot.error));
        phi_ms.push_back(hot.t.front() * 1e3);
        hits.push_back(hot.prompt > 0 ? static_cast<double>(hot.cached) / hot.prompt : 0);
      }
      s.ttft_cold_ms = Median(cold_ms);
      s.ttft_phi_ms = Median(phi_ms);
      s.hit = Median(hits);
    }
    const auto m1 = Metrics(url);
    auto d = [&](const std::string& k) {
      auto a = m1.find(k);
      auto b = m0.find(k);
      return (a == m1.end() ? 0 : a->second) - (b == m0.end() ? 0 : b->second);
    };
    const double rows = d("trellis_grid_tokens_total");
    if (rows > 0) s.bytes_per_token = (d("trellis_grid_bytes_sent_total") + d("trellis_grid_bytes_received_total")) / rows;
    s.head_layers_s = d("trellis_grid_head_layers_seconds_total");
    s.head_wait_s = d("trellis_grid_head_wait_seconds_total");
    s.head_logits_s = d("trellis_grid_head_logits_seconds_total");
    std::vector<double> rtts, bws;
    for (int i = 0; i + 1 < c.nodes; ++i) {
      auto r = m1.find(fmt::format("trellis_grid_node_rtt_seconds{{node=\"{}\"}}", i));
      auto b = m1.find(fmt::format("trellis_grid_node_bandwidth_bytes_per_second{{node=\"{}\"}}", i));
      if (r != m1.end()) rtts.push_back(r->second);
      if (b != m1.end() && b->second > 0) bws.push_back(b->second);
    }
    s.rtt_us = Median(rtts) * 1e6;
    s.bandwidth = Median(bws);
    s.rss = procs->Rss();
    for (size_t i = 0; i < c.layers.size(); ++i) s.expected.push_back(Expected(c, i));
    procs->Stop();
    s.node_compute = procs->NodeComputeSeconds();
    return s;
  }

  Result<StoreSample> RunStore(const Cluster& cl, const std::string& link, const GridConfig& c, int rep) {
    StoreSample s;
    s.link = link, s.config = c.name, s.nodes = c.nodes, s.rep = rep;
    const std::string tag = fmt::format("{}-{}-r{}-store", link, c.name, rep);
    TRELLIS_ASSIGN_OR_RETURN(auto procs, Procs::Start(cl, c, o_, KvBlocks(), tag, /*store=*/true));
    (void)Send(procs->url(), Tokens(16), 4, g_.eos);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<double> cold_ms, store_ms, hits;
    for (int k = 0; k < 3; ++k) {
      prompts.push_back(Tokens(o_.prompt));
      Stream st = Send(procs->url(), prompts.back(), 1, g_.eos);
      if (!st.error.empty()) return Internal(fmt::format("{}: TTFT cold: {}", tag, st.error));
      cold_ms.push_back(st.t.front() * 1e3);
    }
    // Every prompt's whole blocks published (publishes run in the background).
    const double want = 3.0 * ((o_.prompt - 1) / kBlock);
    double published = 0;
    for (int i = 0; i < 300 && published < want; ++i) {
      const auto m = Metrics(procs->url());
      auto it = m.find("trellis_store_published_blocks_total");
      published = it == m.end() ? 0 : it->second;
      if (published < want) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (published < want) return Internal(fmt::format("{}: {} of {} blocks published", tag, published, want));
    TRELLIS_RETURN_IF_ERROR(procs->RestartHead());
    (void)Send(procs->url(), Tokens(16), 4, g_.eos);
    for (const auto& p : prompts) {
      Stream st = Send(procs->url(), p, 1, g_.eos);
      if (!st.error.empty()) return Internal(fmt::format("{}: TTFT from the store: {}", tag, st.error));
      store_ms.push_back(st.t.front() * 1e3);
      hits.push_back(st.prompt > 0 ? static_cast<double>(st.cached) / st.prompt : 0);
    }
    s.ttft_cold_ms = Median(cold_ms);
    s.ttft_store_ms = Median(store_ms);
    s.hit = Median(hits);
    procs->Stop();
    return s;
  }

 private:
  const GridEvalOptions& o_;
  const Geometry& g_;
  std::mt19937 rng_;
};

std::string Join(const std::vector<double>& v, const char* fmt_one) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : " ") + fmt::format(fmt::runtime(fmt_one), x);
  return s;
}

}  // namespace

int RunGridEval(const GridEvalOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "bench grid: %s\n", m.c_str());
    return 1;
  };
  if (o.nodes.empty() || o.reps < 1 || o.sessions < 1 || o.decode_tokens < 4 || o.prompt < 2 * kBlock) {
    return fail("nodes, reps, sessions >= 1, decode tokens >= 4, prompt >= 64");
  }
  if (!(o.phi > 0 && o.phi < 1)) return fail("phi must be in (0, 1)");
  auto geo = ReadGeometry(o.model);
  if (!geo.ok()) return fail(geo.status().ToString());
  const Geometry& g = *geo;
  for (int n : o.nodes) {
    if (n < 1 || n > g.n_layer + 1 || n > 16) return fail(fmt::format("node counts are 1 to {}", std::min(16, g.n_layer + 1)));
  }
  {
    std::error_code ec;
    std::filesystem::create_directories(o.out + "/logs", ec);
    if (ec) return fail(fmt::format("cannot create {}/logs: {}", o.out, ec.message()));
  }

  // The parts, measured first, alone on the machine (and with the other core busy).
  const int r_micro = (o.sessions + o.depth - 1) / o.depth;
  std::vector<int> rows = {1, r_micro, o.sessions};
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::fprintf(stderr, "bench grid: measuring one layer and the output head in this process (%d thread%s)\n",
               o.node_threads, o.node_threads == 1 ? "" : "s");
  auto parts = MeasureParts(o, g, rows);
  if (!parts.ok()) return fail(parts.status().ToString());

  std::vector<GridConfig> configs;
  configs.push_back(GridConfig{fmt::format("baseline-{}t", o.baseline_threads), 1, o.baseline_threads, {g.n_layer}});
  for (int n : o.nodes) configs.push_back(GridConfig{fmt::format("{}-node{}", n, n == 1 ? "" : "s"), n, o.node_threads, Split(g, n)});
  const int max_nodes = *std::max_element(o.nodes.begin(), o.nodes.end());

  struct Link {
    std::string name;
    std::unique_ptr<Cluster> cluster;
  };
  std::vector<Link> links;
  if (o.loopback) links.push_back(Link{"loopback", Cluster::Loopback(max_nodes)});
  if (o.netns) {
    auto c = Cluster::Create(max_nodes, o.rate);
    if (c.ok()) {
      links.push_back(Link{"netns-" + o.rate, std::move(*c)});
    } else {
      std::fprintf(stderr, "bench grid: no namespace runs: %s\n", c.status().message().c_str());
    }
  }
  if (links.empty()) return fail("no link to run on (--no-loopback without namespaces)");

  GridEval ev(o, g);
  std::vector<GridSample> samples;
  std::ofstream csv(o.out + "/grid_eval.csv");
  std::string header = RunHeader() +
                       fmt::format("# model: {} ({} layers, {} wide; {:.1f} MiB per layer, output {:.1f} MiB, embeddings {:.1f} MiB)\n",
                                   o.model, g.n_layer, g.n_embd, g.layer_bytes / (1 << 20), g.output_bytes / (1 << 20),
                                   g.embd_bytes / (1 << 20));
  for (const Link& l : links) header += fmt::format("# link {}: {}\n", l.name, l.cluster->Describe());
  header += fmt::format("# grid: --grid-depth {} --grid-chunk {}; {} thread(s) per grid process\n", o.depth, o.chunk, o.node_threads);
  csv << header
      << "link,config,nodes,rep,decode1_tok_s,decode" << o.sessions
      << "_tok_s,ttft_cold_ms,ttft_phi_ms,hit,bytes_per_token,rtt_us,bandwidth_bytes_s,head_layers_s,head_wait_s,"
         "head_logits_s,rss_mib,expected_mib,node_compute_s\n";
  for (int rep = 0; rep < o.reps; ++rep) {
    for (const Link& l : links) {
      for (const GridConfig& c : configs) {
        std::fprintf(stderr, "bench grid: rep %d/%d, %s, %s (layers %s)\n", rep + 1, o.reps, l.name.c_str(), c.name.c_str(),
                     Join(std::vector<double>(c.layers.begin(), c.layers.end()), "{:.0f}").c_str());
        auto s = ev.Run(*l.cluster, l.name, c, rep);
        if (!s.ok()) return fail(s.status().ToString());
        csv << fmt::format("{},{},{},{},{:.3f},{:.3f},{:.2f},{:.2f},{:.4f},{:.0f},{:.1f},{:.0f},{:.3f},{:.3f},{:.3f},{},{},{}\n",
                           s->link, s->config, s->nodes, s->rep, s->decode1, s->decode_s, s->ttft_cold_ms, s->ttft_phi_ms,
                           s->hit, s->bytes_per_token, s->rtt_us, s->bandwidth, s->head_layers_s, s->head_wait_s,
                           s->head_logits_s, Join(s->rss, "{:.1f}"), Join(s->expected, "{:.1f}"),
                           Join(s->node_compute, "{:.2f}"));
        csv.flush();
        samples.push_back(std::move(*s));
      }
    }
  }
  // The store: one process and every grid of 2 or more, alternating as above.
  std::vector<StoreSample> store_samples;
  if (o.store) {
    std::ofstream sc(o.out + "/grid_store.csv");
    sc << header << "link,config,nodes,rep,ttft_cold_ms,ttft_store_ms,hit\n";
    for (int rep = 0; rep < o.reps; ++rep) {
      for (const Link& l : links) {
        for (const GridConfig& c : configs) {
          if (c.nodes == 1 && c.name.rfind("baseline", 0) != 0) continue;
          std::fprintf(stderr, "bench grid: store, rep %d/%d, %s, %s\n", rep + 1, o.reps, l.name.c_str(), c.name.c_str());
          auto s = ev.RunStore(*l.cluster, l.name, c, rep);
          if (!s.ok()) return fail(s.status().ToString());
          sc << fmt::format("{},{},{},{},{:.2f},{:.2f},{:.4f}\n", s->link, s->config, s->nodes, s->rep, s->ttft_cold_ms,
                            s->ttft_store_ms, s->hit);
          sc.flush();
          store_samples.push_back(std::move(*s));
        }
      }
    }
  }

  // ---- summary ------------------------------------------------------------------------------
  struct Row {
    std::string link, config;
    int nodes = 0;
    std::vector<int> layers;
    double decode1 = 0, decode_s = 0, ttft = 0, ttft_phi = 0, hit = 0, bpt = 0, rtt_us = 0, bw = 0;
    std::vector<double> rss, expected;
    Prediction pred;
  };
  std::vector<Row> rows_out;
  for (const Link& l : links) {
    for (const GridConfig& c : configs) {
      Row r;
      r.link = l.name, r.config = c.name, r.nodes = c.nodes, r.layers = c.layers;
      std::vector<double> a, b, t, tp, h, bp, rt, bw;
      std::vector<std::vector<double>> rss(c.layers.size());
      for (const GridSample& s : samples) {
        if (s.link != l.name || s.config != c.name) continue;
        a.push_back(s.decode1), b.push_back(s.decode_s), t.push_back(s.ttft_cold_ms), tp.push_back(s.ttft_phi_ms);
        h.push_back(s.hit), bp.push_back(s.bytes_per_token), rt.push_back(s.rtt_us), bw.push_back(s.bandwidth);
        for (size_t i = 0; i < rss.size() && i < s.rss.size(); ++i) rss[i].push_back(s.rss[i]);
        r.expected = s.expected;
      }
      r.decode1 = Median(a), r.decode_s = Median(b), r.ttft = Median(t), r.ttft_phi = Median(tp), r.hit = Median(h);
      r.bpt = Median(bp), r.rtt_us = Median(rt), r.bw = Median(bw);
      for (auto& v : rss) r.rss.push_back(Median(v));
      const double cores = static_cast<double>(std::thread::hardware_concurrency());
      const double bw_used = r.bw > 0 ? r.bw : 1e12;
      if (c.name.rfind("baseline", 0) != 0) r.pred = Predict(o, g, *parts, c.layers, r.rtt_us * 1e-6, bw_used, cores, true);
      rows_out.push_back(std::move(r));
    }
  }
  // The prediction for --predict-nodes processes with a core each on a --predict-gbit link,
  // with the round trip measured on the namespace link (else loopback).
  double rtt_link = 0;
  for (const Row& r : rows_out) {
    if (r.nodes > 1 && r.rtt_us > 0 && (rtt_link == 0 || r.link.rfind("netns", 0) == 0)) rtt_link = r.rtt_us * 1e-6;
  }
  const std::vector<int> big_split = Split(g, std::min(o.predict_nodes, g.n_layer + 1));
  const Prediction big = Predict(o, g, *parts, big_split, rtt_link, o.predict_gbit * 1e9 / 8, static_cast<double>(big_split.size()), false);

  {
    std::ofstream f(o.out + "/grid_eval_summary.csv");
    f << header << "link,config,nodes,layers,decode1_tok_s,decode" << o.sessions
      << "_tok_s,ttft_cold_ms,ttft_phi_ms,hit,bytes_per_token,rtt_us,bandwidth_bytes_s,pred_decode1,pred_decode"
      << o.sessions << ",pred_ttft_ms,rss_mib,expected_mib\n";
    for (const Row& r : rows_out) {
      f << fmt::format("{},{},{},{},{:.2f},{:.2f},{:.1f},{:.1f},{:.4f},{:.0f},{:.1f},{:.0f},{:.2f},{:.2f},{:.1f},{},{}\n", r.link,
                       r.config, r.nodes, Join(std::vector<double>(r.layers.begin(), r.layers.end()), "{:.0f}"), r.decode1,
                       r.decode_s, r.ttft, r.ttft_phi, r.hit, r.bpt, r.rtt_us, r.bw, r.pred.decode1, r.pred.decode_s,
                       r.pred.ttft * 1e3, Join(r.rss, "{:.1f}"), Join(r.expected, "{:.1f}"));
    }
    f << fmt::format("prediction,{}-nodes-{}gbit,{},{},0,0,0,0,0,0,{:.1f},0,{:.2f},{:.2f},{:.1f},,\n", big_split.size(),
                     o.predict_gbit, big_split.size(), Join(std::vector<double>(big_split.begin(), big_split.end()), "{:.0f}"),
                     rtt_link * 1e6, big.decode1, big.decode_s, big.ttft * 1e3);
    f << "# parts (seconds, " << o.node_threads << " thread(s), alone / with the other core busy): layer at rows";
    for (const auto& [r, t] : parts->layer) f << fmt::format(" {}:{:.6f}/{:.6f}", r, t, parts->layer_busy.at(r));
    f << "; output at rows";
    for (const auto& [r, t] : parts->output) f << fmt::format(" {}:{:.6f}/{:.6f}", r, t, parts->output_busy.at(r));
    f << fmt::format("; prefill layer per {}-token chunk {:.6f}/{:.6f}, whole {}-token prompt {:.6f}\n", o.chunk,
                     parts->prefill_layer_chunk, parts->prefill_layer_chunk_busy, o.prompt, parts->prefill_layer_whole);
  }

  std::printf("%s\n", header.c_str());
  std::printf("Medians of %d alternating repetitions. decode in tokens/s, TTFT in ms; predicted by the pipeline model from "
              "this machine's measured parts (grid_eval.cc).\n",
              o.reps);
  for (const Link& l : links) {
    std::printf("\n### %s\n\n| config | layers | decode 1 | pred | decode %d | pred | TTFT %d | pred | TTFT phi %.1f (hit) | "
                "bytes/token | RSS MiB (expected) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                l.name.c_str(), o.sessions, o.prompt, o.phi);
    for (const Row& r : rows_out) {
      if (r.link != l.name) continue;
      const bool base = r.config.rfind("baseline", 0) == 0;
      std::string mem;
      for (size_t i = 0; i < r.rss.size(); ++i) {
        mem += fmt::format("{}{:.0f} ({:.0f})", i ? ", " : "", r.rss[i], i < r.expected.size() ? r.expected[i] : 0);
      }
      std::printf("| %s | %s | %.1f | %s | %.1f | %s | %.0f | %s | %.0f (%.0f%%) | %.0f | %s |\n", r.config.c_str(),
                  Join(std::vector<double>(r.layers.begin(), r.layers.end()), "{:.0f}").c_str(), r.decode1,
                  base ? "-" : fmt::format("{:.1f}", r.pred.decode1).c_str(), r.decode_s,
                  base ? "-" : fmt::format("{:.1f}", r.pred.decode_s).c_str(), r.ttft,
                  base ? "-" : fmt::format("{:.0f}", r.pred.ttft * 1e3).c_str(), r.ttft_phi, 100 * r.hit, r.bpt, mem.c_str());
    }
  }
  std::printf("\nPredicted for %zu processes with a core each on a %.0f Gbit/s link (round trip %.0f us as measured): decode 1 "
              "%.1f tok/s, decode %d %.1f tok/s, TTFT %d %.0f ms (layers %s).\n",
              big_split.size(), o.predict_gbit, rtt_link * 1e6, big.decode1, o.sessions, big.decode_s, o.prompt, big.ttft * 1e3,
              Join(std::vector<double>(big_split.begin(), big_split.end()), "{:.0f}").c_str());

  // Targets, per link: 2 nodes against the baseline; memory; TTFT(phi).
  std::printf("\n### Targets\n\n| link | target | value | met |\n|---|---|---|---|\n");
  for (const Link& l : links) {
    const Row* base = nullptr;
    const Row* two = nullptr;
    for (const Row& r : rows_out) {
      if (r.link != l.name) continue;
      if (r.config.rfind("baseline", 0) == 0) base = &r;
      if (r.nodes == 2) two = &r;
    }
    if (base && two) {
      const double dr = two->decode_s / base->decode_s, tr = two->ttft / base->ttft;
      std::printf("| %s | 2 nodes x %d thread, decode %d >= 0.85x one process x %d threads | %.2fx | %s |\n", l.name.c_str(),
                  o.node_threads, o.sessions, o.baseline_threads, dr, dr >= 0.85 ? "yes" : "no");
      std::printf("| %s | 2 nodes TTFT %d <= 1.15x one process | %.2fx | %s |\n", l.name.c_str(), o.prompt, tr,
                  tr <= 1.15 ? "yes" : "no");
    }
    double worst_mem = 0;
    bool phi_ok = true;
    double worst_phi = 0;
    for (const Row& r : rows_out) {
      if (r.link != l.name) continue;
      for (size_t i = 0; i < r.rss.size() && i < r.expected.size(); ++i) {
        worst_mem = std::max(worst_mem, std::abs(r.rss[i] / r.expected[i] - 1));
      }
      const double bound = (1 - r.hit) * r.ttft + 0.05 * r.ttft;
      worst_phi = std::max(worst_phi, r.ttft_phi / std::max(bound, 1e-9));
      phi_ok &= r.ttft_phi <= bound;
    }
    std::printf("| %s | every process's RSS within 10%% of its weights + KV pool | worst %.1f%% off | %s |\n", l.name.c_str(),
                100 * worst_mem, worst_mem <= 0.10 ? "yes" : "no");
    std::printf("| %s | TTFT(phi %.1f) <= (1 - hit) x cold + 5%% | worst %.2f of the bound | %s |\n", l.name.c_str(), o.phi,
                worst_phi, phi_ok ? "yes" : "no");
  }
  if (!store_samples.empty()) {
    // Medians of the per-repetition ratios, as for the targets.
    std::printf("\n### The store: TTFT %d from the store on a new head (empty cache and pools) against computing it\n\n"
                "| link | config | TTFT computed ms | TTFT from the store ms | store / computed | prompt from the store |\n"
                "|---|---|---|---|---|---|\n",
                o.prompt);
    std::ofstream f(o.out + "/grid_store_summary.csv");
    f << header << "link,config,nodes,ttft_cold_ms,ttft_store_ms,ratio,hit\n";
    for (const Link& l : links) {
      for (const GridConfig& c : configs) {
        std::vector<double> cold, st, ratio, hit;
        for (const StoreSample& x : store_samples) {
          if (x.link != l.name || x.config != c.name) continue;
          cold.push_back(x.ttft_cold_ms), st.push_back(x.ttft_store_ms), hit.push_back(x.hit);
          ratio.push_back(x.ttft_store_ms / std::max(x.ttft_cold_ms, 1e-9));
        }
        if (cold.empty()) continue;
        std::printf("| %s | %s | %.0f | %.0f | %.2f | %.0f%% |\n", l.name.c_str(), c.name.c_str(), Median(cold), Median(st),
                    Median(ratio), 100 * Median(hit));
        f << fmt::format("{},{},{},{:.2f},{:.2f},{:.4f},{:.4f}\n", l.name, c.name, c.nodes, Median(cold), Median(st),
                         Median(ratio), Median(hit));
      }
    }
  }
  std::fflush(stdout);

  if (o.plots && !Capture("command -v gnuplot").empty()) {
    for (const Link& l : links) {
      const std::string data = o.out + "/grid_" + l.name + ".dat";
      std::ofstream f(data);
      auto block = [&](auto value) {
        for (const Row& r : rows_out) {
          if (r.link == l.name && r.config.rfind("baseline", 0) != 0) f << r.nodes << " " << value(r) << "\n";
        }
        f << "\n\n";
      };
      block([](const Row& r) { return r.decode_s; });
      block([](const Row& r) { return r.pred.decode_s; });
      block([](const Row& r) { return r.decode1; });
      block([](const Row& r) { return r.pred.decode1; });
      f.close();
      Plot("bench grid", o.out, "grid_decode_" + l.name, fmt::format("decode tokens/s against grid size ({})", l.name), "processes",
           "tokens/s", data,
           {fmt::format("{} sessions, measured", o.sessions), fmt::format("{} sessions, predicted", o.sessions),
            "1 session, measured", "1 session, predicted"},
           false);
      const std::string data2 = o.out + "/grid_ttft_" + l.name + ".dat";
      std::ofstream f2(data2);
      for (const Row& r : rows_out) {
        if (r.link == l.name && r.config.rfind("baseline", 0) != 0) f2 << r.nodes << " " << r.ttft << "\n";
      }
      f2 << "\n\n";
      for (const Row& r : rows_out) {
        if (r.link == l.name && r.config.rfind("baseline", 0) != 0) f2 << r.nodes << " " << r.pred.ttft * 1e3 << "\n";
      }
      f2.close();
      Plot("bench grid", o.out, "grid_ttft_" + l.name, fmt::format("TTFT of a {}-token prompt ({})", o.prompt, l.name),
           "processes", "ms", data2, {"measured", "predicted"}, false);
    }
  }
  return 0;
}

}  // namespace trellis::bench
