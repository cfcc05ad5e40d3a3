// trellis bench serve: concurrent clients sharing a system prompt, against any
// OpenAI-compatible server (trellis serve, llama.cpp's llama-server, ...).
//
// Workload: C clients start together; each sends R requests one after another. Every
// request is a streamed /v1/chat/completions (or /v1/completions with --completions)
// whose prompt is one shared system prompt of about S tokens (deterministic English-like
// text, the same for every server; its length is calibrated with the server's /tokenize
// when it has one) plus a question unique to (client, request); max_tokens M,
// temperature 0. `warmup` requests with the same system prompt are sent first, one at a
// time, and not measured: the numbers describe a server whose cache already holds the
// shared prefix, as a deployed one would.
//
// Per request: TTFT = time from sending to the first chunk carrying text; inter-token
// latency = (last text chunk - first text chunk) / (completion_tokens - 1); usage from
// the final chunk (stream_options.include_usage). Reported: requests/s and generated
// tokens/s over the wall time of the whole run, TTFT p50/p90/p99, mean inter-token
// latency, cached share = sum(usage.prompt_tokens_details.cached_tokens) /
// sum(usage.prompt_tokens) (n/a when the server does not report it), and errors.
//
// Without --url the benchmark starts `trellis serve` (this binary) as a child process on
// a free loopback port (--port 0; the port is read from its start-up line), logs it to
// OUT/server.log, and stops it with SIGTERM at the end.
#include "bench/serve.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <latch>
#include <mutex>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/http.h"
#include "bench/report.h"
#include "util/clock.h"
#include "util/status.h"

namespace trellis::bench {
using namespace trellis::bench;  // NOLINT: the HTTP client pieces (bench/http.h)
namespace {

using nlohmann::json;

// One measured request. Times are seconds from sending the request.
struct RequestResult {
  int client = 0, index = 0;
  std::string error;  // empty = ok
  double ttft = -1, last = -1, e2e = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = -1;  // -1: not reported
  int text_chunks = 0;
};

// --- the workload ---------------------------------------------------------------------

std::string Question(int client, int k) {
  return "Customer " + std::to_string(client) + " asks (question " + std::to_string(k) +
         "): where is my order number " + std::to_string(1000 + 37 * client + k) + "?";
}

json RequestBody(const ServeBenchOptions& o, const std::string& system, const std::string& question) {
  json b = {{"max_tokens", o.max_tokens}, {"temperature", 0}, {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  if (!o.model_name.empty()) b["model"] = o.model_name;
  if (o.completions) {
    b["prompt"] = system + "\n\n" + question + "\nAnswer:";
  } else {
    b["messages"] = json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", question}}});
  }
  if (o.ban_bytes) {  // llama-server's form: [[token id, false]] bans the token
    json ban = json::array();
    for (int i = 0; i <= 258; ++i) ban.push_back(json::array({i, false}));
    b["logit_bias"] = ban;
  }
  return b;
}

// --- HTTP -----------------------------------------------------------------------------

std::unique_ptr<httplib::Client> MakeClient(const Endpoint& ep, const ServeBenchOptions& o) {
  return MakeHttpClient(ep, o.timeout_s, o.keep_alive, o.api_key);
}

// Applies one SSE event's JSON to `r`; `t` is seconds since the request was sent.
void OnEvent(const json& ev, bool completions, double t, RequestResult& r) {
  if (ev.contains("error")) {
    r.error = "stream error: " + ev["error"].dump().substr(0, 200);
    return;
  }
  if (ev.contains("usage") && ev["usage"].is_object()) {
    const json& u = ev["usage"];
    r.prompt_tokens = u.value("prompt_tokens", int64_t{0});
    r.completion_tokens = u.value("completion_tokens", int64_t{0});
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object() &&
        u["prompt_tokens_details"].contains("cached_tokens")) {
      r.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    }
  }
  if (!ev.contains("choices") || !ev["choices"].is_array() || ev["choices"].empty()) return;
  const json& c = ev["choices"][0];
  const json* text = nullptr;
  if (completions && c.contains("text")) text = &c["text"];
  if (!completions && c.contains("delta") && c["delta"].contains("content")) text = &c["delta"]["content"];
  if (text && text->is_string() && !text->get_ref<const std::string&>().empty()) {
    if (r.ttft < 0) r.ttft = t;
    r.last = t;
    ++r.text_chunks;
  }
}

// Sends one streamed request and parses the SSE answer as it arrives.
RequestResult SendOne(httplib::Client& cli, const std::string& path, const json& body, bool completions) {
  RequestResult r;
  const SseOutcome out = PostSse(cli, path, body.dump(), [&](const json& ev, double t) {
    OnEvent(ev, completions, t, r);
    return r.error.empty();
  });
  r.e2e = out.seconds;
  if (!r.error.empty()) return r;
  if (!out.error.empty()) {
    r.error = out.error;
  } else if (r.ttft < 0) {
    r.error = "no text chunk in the stream";
  } else if (r.prompt_tokens == 0) {
    r.error = "no usage in the stream";
  }
  return r;
}

// --- the server started here ----------------------------------------------------------

// Starts `trellis serve` (this binary) on a free loopback port; returns its address.
Result<std::string> StartTrellis(ChildProcess& server, const ServeBenchOptions& o, const std::string& log_path) {
  std::vector<std::string> args = {"trellis", "serve", "-m", o.model, "--host", "127.0.0.1", "--port", "0",
                                   "--threads", std::to_string(o.threads)};
  std::istringstream extra(o.serve_args);
  for (std::string a; extra >> a;) args.push_back(a);
  return server.Start("/proc/self/exe", std::move(args), log_path, "trellis serve");
}

// --- statistics and output ------------------------------------------------------------

// Percentiles (0-100) interpolated between closest ranks, as numpy's default.
double Percentile(const std::vector<double>& v, double p) { return bench::QuantileLinear(v, p / 100.0); }

json Summarize(const ServeBenchOptions& o, const std::string& url, int system_tokens,
               const std::vector<RequestResult>& rs, double wall) {
  std::vector<double> ttft, itl;
  int64_t prompt = 0, cached = 0, completion = 0, prompt_reporting = 0;
  int ok = 0;
  json errors = json::array();
  for (const RequestResult& r : rs) {
    if (!r.error.empty()) {
      if (errors.size() < 5) errors.push_back("client " + std::to_string(r.client) + " request " + std::to_string(r.index) + ": " + r.error);
      continue;
    }
    ++ok;
    ttft.push_back(r.ttft * 1e3);
    completion += r.completion_tokens;
    prompt += r.prompt_tokens;
    if (r.cached_tokens >= 0) {
      cached += r.cached_tokens;
      prompt_reporting += r.prompt_tokens;
    }
    const int64_t steps = (r.completion_tokens > 1 ? r.completion_tokens : r.text_chunks) - 1;
    if (steps > 0 && r.last > r.ttft) itl.push_back((r.last - r.ttft) * 1e3 / static_cast<double>(steps));
  }
  double itl_mean = 0;
  for (double x : itl) itl_mean += x;
  if (!itl.empty()) itl_mean /= static_cast<double>(itl.size());
  json j = {{"label", o.label}, {"url", url}, {"endpoint", o.completions ? "/v1/completions" : "/v1/chat/completions"},
            {"clients", o.clients}, {"requests_per_client", o.requests}, {"system_tokens", system_tokens},
            {"max_tokens", o.max_tokens}, {"warmup", o.warmup}, {"requests_ok", ok},
            {"errors", static_cast<int>(rs.size()) - ok}, {"error_messages", errors}, {"wall_s", wall},
            {"req_s", ok / wall}, {"gen_tok_s", static_cast<double>(completion) / wall},
            {"ttft_ms_p50", Percentile(ttft, 50)}, {"ttft_ms_p90", Percentile(ttft, 90)},
            {"ttft_ms_p99", Percentile(ttft, 99)}, {"itl_ms_mean", itl_mean}, {"prompt_tokens", prompt},
            {"completion_tokens", completion}, {"cached_tokens", nullptr}, {"cached_share", nullptr}};
  if (prompt_reporting > 0) {
    j["cached_tokens"] = cached;
    j["cached_share"] = static_cast<double>(cached) / static_cast<double>(prompt_reporting);
  }
  return j;
}

std::string ShareText(const json& j) {
  if (j["cached_share"].is_null()) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * j["cached_share"].get<double>());
  return b;
}

void PrintTable(const json& j) {
  std::printf("| server | clients x requests | system tokens | max_tokens | ok | errors | requests/s | generated tok/s "
              "| TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | inter-token ms | cached share |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %d x %d | %d | %d | %d | %d | %.2f | %.1f | %.0f | %.0f | %.0f | %.1f | %s |\n",
              j["label"].get<std::string>().c_str(), j["clients"].get<int>(), j["requests_per_client"].get<int>(),
              j["system_tokens"].get<int>(), j["max_tokens"].get<int>(), j["requests_ok"].get<int>(),
              j["errors"].get<int>(), j["req_s"].get<double>(), j["gen_tok_s"].get<double>(),
              j["ttft_ms_p50"].get<double>(), j["ttft_ms_p90"].get<double>(), j["ttft_ms_p99"].get<double>(),
              j["itl_ms_mean"].get<double>(), ShareText(j).c_str());
  for (const auto& e : j["error_messages"]) std::printf("  error: %s\n", e.get<std::string>().c_str());
}

Status WriteCsv(const ServeBenchOptions& o, const json& j, const std::vector<RequestResult>& rs) {
  ::mkdir(o.out_dir.c_str(), 0755);
  const std::string summary = o.out_dir + "/serve.csv";
  std::ofstream f(summary, std::ios::app);
  if (f.tellp() == 0) {
    f << "label,url,endpoint,clients,requests_per_client,system_tokens,max_tokens,requests_ok,errors,wall_s,req_s,"
         "gen_tok_s,ttft_ms_p50,ttft_ms_p90,ttft_ms_p99,itl_ms_mean,prompt_tokens,cached_tokens,cached_share\n";
  }
  auto num = [](const json& v) { return v.is_null() ? std::string() : v.dump(); };
  f << j["label"].get<std::string>() << "," << j["url"].get<std::string>() << "," << j["endpoint"].get<std::string>();
  for (const char* k : {"clients", "requests_per_client", "system_tokens", "max_tokens", "requests_ok", "errors", "wall_s",
                        "req_s", "gen_tok_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_mean", "prompt_tokens",
                        "cached_tokens", "cached_share"}) {
    f << "," << num(j[k]);
  }
  f << "\n";
  if (!f) return IoError("cannot write " + summary);
  std::string safe = o.label;
  for (char& c : safe) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  }
  const std::string per = o.out_dir + "/requests-" + safe + ".csv";
  std::ofstream g(per);
  g << "client,request,error,ttft_ms,e2e_ms,prompt_tokens,cached_tokens,completion_tokens,text_chunks\n";
  for (const RequestResult& r : rs) {
    std::string e = r.error;
    std::replace(e.begin(), e.end(), ',', ';');
    std::replace(e.begin(), e.end(), '\n', ' ');
    g << r.client << "," << r.index << "," << e << "," << r.ttft * 1e3 << "," << r.e2e * 1e3 << "," << r.prompt_tokens
      << "," << r.cached_tokens << "," << r.completion_tokens << "," << r.text_chunks << "\n";
  }
  if (!g) return IoError("cannot write " + per);
  return {};
}

// --- the run --------------------------------------------------------------------------

Status RunAgainst(const ServeBenchOptions& o, const std::string& url) {
  const Endpoint ep = ParseUrl(url);
  const std::string path = ep.prefix + (o.completions ? "/v1/completions" : "/v1/chat/completions");
  auto setup = MakeClient(ep, o);
  int system_tokens = -1;
  const std::string system = CalibratedBookshopText(*setup, ep, o.system_tokens, system_tokens);
  for (int i = 0; i < o.warmup; ++i) {
    RequestResult w = SendOne(*setup, path, RequestBody(o, system, "Warm-up question " + std::to_string(i) + "."), o.completions);
    if (!w.error.empty()) return Failure("bench serve: warm-up request failed: " + w.error);
  }
  std::vector<RequestResult> results(static_cast<size_t>(o.clients) * static_cast<size_t>(o.requests));
  std::latch start(o.clients + 1);
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      auto cli = MakeClient(ep, o);
      start.arrive_and_wait();
      for (int k = 0; k < o.requests; ++k) {
        RequestResult r = SendOne(*cli, path, RequestBody(o, system, Question(c, k)), o.completions);
        r.client = c;
        r.index = k;
        results[static_cast<size_t>(c) * static_cast<size_t>(o.requests) + static_cast<size_t>(k)] = r;
      }
    });
  }
  start.arrive_and_wait();
  const double t0 = NowSeconds();
  for (auto& t : threads) t.join();
  const double wall = NowSeconds() - t0;

  const json j = Summarize(o, url, system_tokens, results, wall);
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    PrintTable(j);
  }
  if (Status s = WriteCsv(o, j, results); !s.ok()) return Failure(s.ToString());
  const int errors = j["errors"].get<int>();
  return errors == 0 ? Status::Ok() : Failure("bench serve: " + std::to_string(errors) + " requests failed");
}

}  // namespace

Status RunServeBench(const ServeBenchOptions& opts) {
  ServeBenchOptions o = opts;
  if (o.clients < 1 || o.requests < 1 || o.system_tokens < 1 || o.max_tokens < 1 || o.warmup < 0 || o.threads < 1 ||
      o.timeout_s < 1) {
    return Failure("bench serve: clients, requests, system-tokens, max-tokens, threads, timeout >= 1; warmup >= 0");
  }
  ::mkdir(o.out_dir.c_str(), 0755);
  if (!o.url.empty()) {
    if (o.label.empty()) o.label = o.url;
    return RunAgainst(o, o.url);
  }
  if (o.label.empty()) o.label = "trellis";
  ChildProcess server;
  auto addr = StartTrellis(server, o, o.out_dir + "/server.log");
  if (!addr.ok()) return Failure(addr.status().ToString());
  const Status rc = RunAgainst(o, *addr);
  server.Stop();
  return rc;
}

}  // namespace trellis::bench
