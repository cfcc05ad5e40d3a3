#include "bench/http.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "util/clock.h"

namespace trellis::bench {

using nlohmann::json;

Endpoint ParseUrl(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t scheme = url.find("://");
  const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  Endpoint e{url.substr(0, slash), slash == std::string::npos ? "" : url.substr(slash)};
  if (e.prefix.size() >= 3 && e.prefix.compare(e.prefix.size() - 3, 3, "/v1") == 0) e.prefix.resize(e.prefix.size() - 3);
  return e;
}

std::unique_ptr<httplib::Client> MakeHttpClient(const Endpoint& ep, int timeout_s, bool keep_alive,
                                                const std::string& api_key) {
  auto c = std::make_unique<httplib::Client>(ep.host_port);
  c->set_connection_timeout(10);
  c->set_read_timeout(timeout_s);
  c->set_write_timeout(30);
  c->set_keep_alive(keep_alive);
  c->set_tcp_nodelay(true);
  if (!api_key.empty()) c->set_bearer_token_auth(api_key.c_str());
  return c;
}

SseOutcome PostSse(httplib::Client& cli, const std::string& path, const std::string& body,
                   const std::function<bool(const json&, double)>& on_event) {
  SseOutcome out;
  std::string buf, raw;
  const double t0 = NowSeconds();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
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
        out.done = true;
        continue;
      }
      json ev = json::parse(payload, nullptr, false);
      if (ev.is_discarded()) {
        out.error = "bad SSE event: " + payload.substr(0, 120);
        return false;
      }
      if (!on_event(ev, t)) {
        out.aborted = true;
        return false;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  out.seconds = NowSeconds() - t0;
  if (!out.error.empty() || out.aborted) return out;
  if (!sent) {
    out.error = "HTTP client: " + httplib::to_string(err);
  } else if (res.status != 200) {
    out.error = "HTTP " + std::to_string(res.status) + ": " + raw.substr(0, 200);
  } else if (!out.done) {
    out.error = "stream ended without [DONE]";
  }
  return out;
}

int CountTokens(httplib::Client& cli, const Endpoint& ep, const std::string& text) {
  auto res = cli.Post(ep.prefix + "/tokenize", json({{"content", text}, {"add_special", false}}).dump(), "application/json");
  if (!res || res->status != 200) return -1;
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("tokens") || !j["tokens"].is_array()) return -1;
  return static_cast<int>(j["tokens"].size());
}

double ScrapeMetric(httplib::Client& cli, const Endpoint& ep, const std::string& name) {
  auto res = cli.Get(ep.prefix + "/metrics");
  if (!res || res->status != 200) return -1;
  const std::string& b = res->body;
  for (size_t at = 0; at < b.size();) {
    size_t eol = b.find('\n', at);
    if (eol == std::string::npos) eol = b.size();
    const std::string_view line(b.data() + at, eol - at);
    if (line.size() > name.size() && line.substr(0, name.size()) == name && line[name.size()] == ' ') {
      return std::strtod(std::string(line.substr(name.size() + 1)).c_str(), nullptr);
    }
    at = eol + 1;
  }
  return -1;
}

std::string BookshopText(int n_words) {
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

std::string CalibratedBookshopText(httplib::Client& cli, const Endpoint& ep, int target, int& n_tokens) {
  int words = std::max(1, target * 3 / 4);  // English text: ~1.3 tokens per word
  std::string text = BookshopText(words);
  n_tokens = -1;
  for (int round = 0; round < 4; ++round) {
    n_tokens = CountTokens(cli, ep, text);
    if (n_tokens <= 0 || std::abs(n_tokens - target) <= 4) break;
    words = std::max(1, static_cast<int>(std::lround(words * static_cast<double>(target) / n_tokens)));
    text = BookshopText(words);
  }
  if (n_tokens > 0) n_tokens = CountTokens(cli, ep, text);
  return text;
}

Result<std::string> ChildProcess::Start(const std::string& exe, std::vector<std::string> args,
                                        const std::string& log_path, const std::string& name, int timeout_s) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::remove(log_path.c_str());  // a previous run's start-up line must not be read
  std::fflush(nullptr);
  pid_ = fork();
  if (pid_ < 0) return IoError("fork failed");
  if (pid_ == 0) {
    if (!std::freopen(log_path.c_str(), "w", stderr) || dup2(fileno(stderr), STDOUT_FILENO) < 0) _exit(127);
    execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "cannot run %s\n", exe.c_str());
    _exit(127);
  }
  const std::string key = "listening on ";
  for (int i = 0; i < timeout_s * 10; ++i) {
    std::ifstream f(log_path);
    std::string line;
    while (std::getline(f, line)) {
      const size_t p = line.find(key);
      if (p == std::string::npos) continue;
      std::string addr = line.substr(p + key.size());
      addr = addr.substr(0, addr.find_first_of(" \t\r\x1b"));
      if (!addr.empty()) return addr;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return IoError(name + " exited at start-up; see " + log_path);
    }
    usleep(100 * 1000);
  }
  Stop();
  return IoError(name + " printed no address within " + std::to_string(timeout_s) + " s; see " + log_path);
}

void ChildProcess::Stop() {
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

}  // namespace trellis::bench
