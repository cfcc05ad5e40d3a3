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
#include "cli/bench_serve.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

#include "cli/commands.h"
#include "util/clock.h"
#include "util/status.h"

namespace trellis::cli {
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

// `n_words` words of deterministic English-like text; a longer text extends a shorter one.
std::string SystemText(int n_words) {
  static const char* kWords[] = {
      "the", "service", "answers", "questions", "about", "orders", "and", "delivery", "of", "books",
      "to", "customers", "in", "every", "region", "with", "care", "when", "a", "parcel",
      "is", "late", "we", "check", "tracking", "number", "first", "then", "offer", "refund",
      "or", "new", "shipment", "for", "free", "our", "store", "opens", "at", "eight",
      "closes", "six", "on", "weekdays", "never", "promise", "dates", "that", "warehouse", "cannot",
      "meet", "always", "be", "polite", "short", "clear", "mention", "return", "policy", "thirty",
      "days", "gift", "cards", "are", "not", "refundable", "shipping", "costs", "depend", "weight",
      "destination", "express", "takes", "two", "standard", "five", "working", "if", "unsure", "ask"};
  constexpr uint64_t kN = sizeof(kWords) / sizeof(kWords[0]);
  std::string s = "You are the assistant of an online bookshop.";
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < n_words; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::string w = kWords[(x >> 33) % kN];
    const bool start = i % 12 == 0;
    if (start) w[0] = static_cast<char>(w[0] - 'a' + 'A');
    s += " " + w;
    if (i % 12 == 11) s += ".";
  }
  return s + ".";
}

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

// "http://host:port[/prefix][/v1]" -> client address and path prefix.
struct Endpoint {
  std::string host_port, prefix;
};

Endpoint ParseUrl(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t scheme = url.find("://");
  const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  Endpoint e{url.substr(0, slash), slash == std::string::npos ? "" : url.substr(slash)};
  if (e.prefix.size() >= 3 && e.prefix.compare(e.prefix.size() - 3, 3, "/v1") == 0) e.prefix.resize(e.prefix.size() - 3);
  return e;
}

std::unique_ptr<httplib::Client> MakeClient(const Endpoint& ep, const ServeBenchOptions& o) {
  auto c = std::make_unique<httplib::Client>(ep.host_port);
  c->set_connection_timeout(10);
  c->set_read_timeout(o.timeout_s);
  c->set_write_timeout(30);
  // One connection per request by default: on a kept-alive connection to a server that
  // does not set TCP_NODELAY (trellis serve, cpp-httplib 0.11), Nagle's algorithm and
  // the client's delayed ACKs hold each streamed chunk back up to ~40 ms.
  c->set_keep_alive(o.keep_alive);
  c->set_tcp_nodelay(true);
  if (!o.api_key.empty()) c->set_bearer_token_auth(o.api_key.c_str());
  return c;
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
  std::string buf, raw;
  bool done = false;
  const double t0 = NowSeconds();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double t = NowSeconds() - t0;
    buf.append(data, n);
    if (raw.size() < 512) raw.append(data, std::min<size_t>(n, 512));
    size_t end;
    while ((end = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, end);
      buf.erase(0, end + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) != 0) continue;  // blank lines, ": ping" comments
      std::string payload = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json ev = json::parse(payload, nullptr, false);
      if (ev.is_discarded()) {
        r.error = "bad SSE event: " + payload.substr(0, 120);
        return false;
      }
      OnEvent(ev, completions, t, r);
      if (!r.error.empty()) return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  r.e2e = NowSeconds() - t0;
  if (!r.error.empty()) return r;
  if (!sent) {
    r.error = "HTTP client: " + httplib::to_string(err);
  } else if (res.status != 200) {
    r.error = "HTTP " + std::to_string(res.status) + ": " + raw.substr(0, 200);
  } else if (!done) {
    r.error = "stream ended without [DONE]";
  } else if (r.ttft < 0) {
    r.error = "no text chunk in the stream";
  } else if (r.prompt_tokens == 0) {
    r.error = "no usage in the stream";
  }
  return r;
}

// Token count of `text` by the server's /tokenize (llama.cpp's and trellis's shape), or -1.
int CountTokens(httplib::Client& cli, const Endpoint& ep, const std::string& text) {
  auto res = cli.Post(ep.prefix + "/tokenize", json({{"content", text}, {"add_special", false}}).dump(), "application/json");
  if (!res || res->status != 200) return -1;
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("tokens") || !j["tokens"].is_array()) return -1;
  return static_cast<int>(j["tokens"].size());
}

// The system prompt, sized to about `target` tokens; `n_tokens` gets its count (-1 = unknown).
std::string CalibratedSystem(httplib::Client& cli, const Endpoint& ep, int target, int& n_tokens) {
  int words = std::max(1, target * 3 / 4);  // English text: ~1.3 tokens per word
  std::string text = SystemText(words);
  n_tokens = -1;
  for (int round = 0; round < 4; ++round) {
    n_tokens = CountTokens(cli, ep, text);
    if (n_tokens <= 0 || std::abs(n_tokens - target) <= 4) break;
    words = std::max(1, static_cast<int>(std::lround(words * static_cast<double>(target) / n_tokens)));
    text = SystemText(words);
  }
  if (n_tokens > 0) n_tokens = CountTokens(cli, ep, text);
  return text;
}

// --- the server started here ----------------------------------------------------------

// `trellis serve` as a child process on a free loopback port. Stopped (SIGTERM, then
// SIGKILL after 10 s) when destroyed.
class ChildServer {
 public:
  ChildServer() = default;
  ChildServer(const ChildServer&) = delete;
  ChildServer& operator=(const ChildServer&) = delete;
  ~ChildServer() { Stop(); }

  // Starts the server and waits (up to 120 s) until it prints its address.
  Result<std::string> Start(const ServeBenchOptions& o, const std::string& log_path) {
    std::vector<std::string> args = {"trellis", "serve", "-m", o.model, "--host", "127.0.0.1", "--port", "0",
                                     "--threads", std::to_string(o.threads)};
    std::istringstream extra(o.serve_args);
    for (std::string a; extra >> a;) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::remove(log_path.c_str());  // a previous run's start-up line must not be read
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) return IoError("fork failed");
    if (pid_ == 0) {
      if (!std::freopen(log_path.c_str(), "w", stderr) || !std::freopen("/dev/null", "w", stdout)) _exit(127);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    const std::string key = "listening on ";
    for (int i = 0; i < 1200; ++i) {
      std::ifstream f(log_path);
      std::string line;
      while (std::getline(f, line)) {
        const size_t p = line.find(key);
        if (p != std::string::npos) return line.substr(p + key.size(), line.find(' ', p + key.size()) - p - key.size());
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return IoError("trellis serve exited at start-up; see " + log_path);
      }
      usleep(100 * 1000);
    }
    return IoError("trellis serve printed no address within 120 s; see " + log_path);
  }

  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      usleep(100 * 1000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// --- statistics and output ------------------------------------------------------------

// Linear interpolation between closest ranks (numpy's default); 0 for no data.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

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

int RunAgainst(const ServeBenchOptions& o, const std::string& url) {
  const Endpoint ep = ParseUrl(url);
  const std::string path = ep.prefix + (o.completions ? "/v1/completions" : "/v1/chat/completions");
  auto setup = MakeClient(ep, o);
  int system_tokens = -1;
  const std::string system = CalibratedSystem(*setup, ep, o.system_tokens, system_tokens);
  for (int i = 0; i < o.warmup; ++i) {
    RequestResult w = SendOne(*setup, path, RequestBody(o, system, "Warm-up question " + std::to_string(i) + "."), o.completions);
    if (!w.error.empty()) return Fail("bench serve: warm-up request failed: " + w.error);
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
  if (Status s = WriteCsv(o, j, results); !s.ok()) return Fail(s.ToString());
  return j["errors"].get<int>() == 0 ? 0 : 1;
}

}  // namespace

int RunServeBench(const ServeBenchOptions& opts) {
  ServeBenchOptions o = opts;
  if (o.clients < 1 || o.requests < 1 || o.system_tokens < 1 || o.max_tokens < 1 || o.warmup < 0 || o.threads < 1 ||
      o.timeout_s < 1) {
    return Fail("bench serve: clients, requests, system-tokens, max-tokens, threads, timeout >= 1; warmup >= 0");
  }
  ::mkdir(o.out_dir.c_str(), 0755);
  if (!o.url.empty()) {
    if (o.label.empty()) o.label = o.url;
    return RunAgainst(o, o.url);
  }
  if (o.label.empty()) o.label = "trellis";
  ChildServer server;
  auto addr = server.Start(o, o.out_dir + "/server.log");
  if (!addr.ok()) return Fail(addr.status().ToString());
  const int rc = RunAgainst(o, *addr);
  server.Stop();
  return rc;
}

}  // namespace trellis::cli
