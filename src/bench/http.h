// HTTP pieces shared by the server benchmarks (`bench serve`, `bench chat`): the base URL
// split into a client address and a path prefix, a cpp-httplib client set up for
// streaming, one streamed POST read as server-sent events, the server's /tokenize, the
// deterministic English-like prompt text, and a server run as a child process.
//
// Thread-safety: free functions are safe from any thread; an httplib::Client and a
// ChildProcess belong to one thread at a time.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "util/status.h"

namespace trellis::bench {

// "http://host:port[/prefix][/v1]" -> client address "http://host:port" and path prefix
// (without a trailing "/v1": the benchmarks append "/v1/..." themselves).
struct Endpoint {
  std::string host_port, prefix;
};
Endpoint ParseUrl(std::string url);

// A client for `ep`: TCP_NODELAY, `timeout_s` to read an answer, one connection per
// request unless `keep_alive` (on a kept-alive connection to a server that does not set
// TCP_NODELAY, Nagle's algorithm and the client's delayed ACKs hold each streamed chunk
// back up to ~40 ms), a bearer token when `api_key` is not empty.
std::unique_ptr<httplib::Client> MakeHttpClient(const Endpoint& ep, int timeout_s, bool keep_alive = false,
                                                const std::string& api_key = "");

// What one streamed POST came to. `error` is empty when the server answered 200 and the
// stream ended with "data: [DONE]"; a callback's abort leaves `error` empty too (the
// caller knows why it stopped).
struct SseOutcome {
  std::string error;
  bool done = false;     // "data: [DONE]" seen
  bool aborted = false;  // on_event returned false
  double seconds = 0;    // sending to the end of the answer
};

// Sends `body` (JSON) to `path` and calls on_event(event, seconds since sending) for each
// `data:` JSON payload as it arrives; on_event returns false to stop reading. A payload
// that is not JSON ends the request with an error.
SseOutcome PostSse(httplib::Client& cli, const std::string& path, const std::string& body,
                   const std::function<bool(const nlohmann::json&, double)>& on_event);

// Token count of `text` by the server's /tokenize (llama.cpp's and trellis's shape, no
// special tokens added), or -1 when the server has no such endpoint.
int CountTokens(httplib::Client& cli, const Endpoint& ep, const std::string& text);

// The value of an unlabelled metric in the server's Prometheus /metrics, or -1 when the
// server has no such endpoint or metric.
double ScrapeMetric(httplib::Client& cli, const Endpoint& ep, const std::string& name);

// "You are the assistant of an online bookshop." plus `n_words` words of deterministic
// English-like text, in sentences of 12 words; a longer text extends a shorter one.
std::string BookshopText(int n_words);

// BookshopText sized to about `target` tokens by the server's /tokenize (a few rounds of
// proportional correction); `n_tokens` gets its count, -1 when the server cannot count
// (the text is then sized at ~1.3 tokens per word).
std::string CalibratedBookshopText(httplib::Client& cli, const Endpoint& ep, int target, int& n_tokens);

// A server run as a child process, its stdout and stderr in a log file. Stopped
// (SIGTERM, then SIGKILL after 10 s) when destroyed.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Stop(); }

  // Runs `exe` with `args` (args[0] is argv[0]) and waits up to `timeout_s` for a log
  // line holding "listening on ADDRESS" (trellis serve and llama-server both print one);
  // returns ADDRESS, e.g. "http://127.0.0.1:41234". `name` is for messages.
  // REQUIRES: not running.
  Result<std::string> Start(const std::string& exe, std::vector<std::string> args, const std::string& log_path,
                            const std::string& name, int timeout_s = 120);

  // SIGTERM, then SIGKILL after 10 s; no-op when not running.
  void Stop();
  pid_t pid() const { return pid_; }  // -1 when not running

 private:
  pid_t pid_ = -1;
};

}  // namespace trellis::bench
